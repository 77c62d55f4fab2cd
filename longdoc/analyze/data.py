"""What `longdoc analyze attention` runs the model on: a task's features, or plain text.

- `--task TASK --data FILE`: the task's own features of the file (its official format), found through
  the task registry: the windows `longdoc train TASK` builds (labels left out), with the model's
  lengths and input conventions. A model trained on another task, or a bare encoder, takes the task
  model's default feature settings (stride, question length).
- `--data FILE|FOLDER` without a task: plain text, as continued pretraining packs it
  (longdoc.data.pretraining_corpus): each document split into sentences and packed into inputs of up
  to the model's long_max_len tokens, one global token per sentence linked to its tokens (hard g2l
  where the model has it); nothing is masked. A model without global tokens (global_max_len under 2)
  reads the same long inputs alone.

`model_inputs` gives the first `limit` inputs (windows) as rows for `collate`.
"""

import copy
import functools
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from longdoc.errors import InputError
from longdoc.model.config import GlobalLocalConfig
from longdoc.data.task import Task

JSON_SUFFIXES = (".json", ".jsonl", ".gz")


def task_rows(task: Task, path: Path, tokenizer, config: GlobalLocalConfig,
              progress: bool) -> tuple[list[dict[str, Any]], Callable]:
    """The rows of the task's features of `path`, and the task's collate."""
    if task.features is None or task.model is None:
        raise InputError(f"the {task.name} task has no features to analyse yet")
    defaults = task.load("model").default_task_options
    own = getattr(config, "task_options", None) or {}
    config = copy.deepcopy(config)
    config.task_options = {**defaults, **{name: value for name, value in own.items() if name in defaults}}
    features = task.load("features")
    rows = features.training_features(path, tokenizer, config, None, progress=progress)  # (its reader checks the file)
    return rows, functools.partial(features.collate, pad_token_id=config.pad_token_id)


@contextmanager
def _datasets_progress(shown: bool) -> Iterator[None]:
    """datasets' progress bars shown or not inside the block, as they were after it."""
    import datasets

    hidden_before = datasets.are_progress_bars_disabled()
    if not shown:
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not shown and not hidden_before:
            datasets.enable_progress_bars()


def text_rows(path: Path, tokenizer, config: GlobalLocalConfig, limit: int,
              progress: bool) -> tuple[list[dict[str, Any]], Callable]:
    """The first `limit` plain-text inputs of `path` (a file or a folder of them), and their collate."""
    import torch

    from longdoc.data.batching import collate_features
    from longdoc.data.pretraining_corpus import PretrainingCollator, PretrainingSettings, prepare_corpus, read_corpus

    if path.is_file() and path.name.endswith(JSON_SUFFIXES):
        raise InputError(f"{path}: a JSON file is a task's data: give --task TASK (plain text files otherwise)")
    if path.is_dir() and not any(found.is_file() for found in path.rglob("*")):
        raise InputError(f"--data {path}: the folder holds no files")
    has_globals = config.global_max_len >= 2
    # Without global tokens, sentences are packed as with them (as many as fit), then the globals dropped.
    settings = PretrainingSettings(long_length=config.long_max_len, min_sentences=1,
                                   global_max_len=config.global_max_len if has_globals else config.long_max_len)
    with _datasets_progress(progress):
        inputs, _ = prepare_corpus(read_corpus(path), tokenizer, settings)
    sentences = PretrainingCollator(tokenizer, settings, config)
    rows = []
    for packed in inputs.select(range(min(limit, len(inputs)))):
        row = sentences.sentences_row(torch.tensor(packed["long_input_ids"]), torch.tensor(packed["sentence_ids"]),
                                      packed["num_sentences"])
        rows.append(row if has_globals else {name: value for name, value in row.items() if name.startswith("long_")})
    return rows, functools.partial(collate_features, pad_token_id=config.pad_token_id)


def model_inputs(path: Path, task: Task | None, tokenizer, config: GlobalLocalConfig, limit: int,
                 progress: bool = True) -> tuple[list[dict[str, Any]], Callable]:
    """The first `limit` inputs of `path` (see the module docstring) and their collate.

    Args:
        path: the data: a task's file in its official format, or with no task a plain text file or
            a folder of them (--data).
        task: the task whose features are built; None: plain text, packed as continued
            pretraining packs it.
        tokenizer: the model's tokenizer.
        config: the model's config (lengths, input conventions, its task's options if any).
        limit: the most inputs (windows) kept.
        progress: show the feature builder's progress bars.

    Returns:
        (the rows, each a dict of one input's features; `collate`, which batches such rows).

    Raises:
        InputError: `path` missing, not of the kind the task (or plain text) reads, or giving no
            input, naming the file.
    """
    if not path.exists():
        raise InputError(f"{path}: no such file or folder (--data)")
    if task is None:
        rows, collate = text_rows(path, tokenizer, config, limit, progress)
    else:
        rows, collate = task_rows(task, path, tokenizer, config, progress)
    if not rows:
        what = f"{task.name} windows" if task else "text"
        raise InputError(f"{path}: no {what} to analyse")
    return rows[:limit], collate


def batches(rows: Sequence[dict[str, Any]], batch_size: int) -> list[list[int]]:
    """Row indices in batches of similar length (longest first, as prediction batches them)."""
    from longdoc.model.task_model import length_batches

    return length_batches([len(row["long_input_ids"]) for row in rows], batch_size)
