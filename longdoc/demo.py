"""The README's main job (`longdoc demo`): long-document QA learned on the CPU, against the same
model restricted to the first 512 tokens, on the multihop task of the registry the command hands in
(its generator found through the task's record, so this module imports no task).

Steps, each on the library's own code path:
1. seeded training and held-out dev files from the built-in generator (`longdoc make-data
   multihop`): documents of `length` wordpieces, each with one bridge question ("Where is the
   employer of A based?") whose two facts are at least `min_distance` wordpieces apart, in the
   order of the chain, so the sentence that holds the answer always lies past the first 512;
2. the held-out file cut to its first `restricted_length` wordpieces (`first_tokens`: whole
   sentences, counted exactly as the feature builder lays them out; the gold answers and
   supporting facts are kept, so both rows are scored against the same gold);
3. one run of `longdoc train multihop` (`longdoc.train.finetune.train_task`) with the shipped
   options (`tasks/multihop/configs/demo.json`): the lifted MiniLM reading whole documents; it
   ends with predictions on the dev file scored by the official HotpotQA metric (its metrics.json);
4. the same trained model predicting on the cut dev file (`longdoc predict` + `longdoc evaluate
   --out`): the row a 512-token encoder (BERT, MiniLM as published) would give, since it never
   sees the answer sentence; then the leaderboard of the two rows (`longdoc leaderboard`);
5. the whole-document model copied to a model folder (`--model-dir`) with a model card saying it
   was trained on generated documents only (`longdoc ask` warns of that), and the first held-out
   example written as a plain text file for one question to it (`longdoc demo` then asks it with
   `longdoc ask --model` that folder).

The demo's documents carry no relation distractors (the two facts are the only "works for" and
"based in" sentences): what it asks is reading far enough, which the model learns in minutes on a
CPU. The full multi-hop setting (distractor relations and decoys about the same cities and
companies, comparison questions), with both models trained, is scripts/bench_multihop.py's (its timed runs: benchmarks/multihop.py).
"""

import importlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping

from longdoc.data.task import Task, TaskLookup
from longdoc.errors import OptionError
from longdoc.model.cache import cache_dir

TASK_NAME = "multihop"
CONFIG_NAME = "demo"  # tasks/multihop/configs/demo.json: the training options
FULL_RUN = "full"
RESTRICTED_RUN = "first-{length}"
# After answer F1 (the headline): what the demo's questions test (`longdoc leaderboard` shows all).
LEADERBOARD_COLUMNS = ["em", "sp_f1", "joint_f1"]
MODEL_CARD_TEXT = """# longdoc demo model (multihop)

This model was trained on generated documents only (`longdoc make-data multihop`: invented people,
companies and cities, {length} wordpieces each), by `longdoc demo`. It answers questions like the
generator's; its answers on real documents may be wrong.
"""


def generator_of(task: Task) -> ModuleType:
    """The generator module the task's record names (`extras["generator"]`: the multihop task's)."""
    return importlib.import_module(task.extras["generator"])


def default_out() -> Path:
    """Where `longdoc demo` writes its data and runs unless told (models and checkpoints: not into
    the folder it is run from)."""
    return cache_dir() / "demo"


def default_model_dir() -> Path:
    """Where `longdoc demo` saves its trained multi-hop model, for `longdoc ask --model`."""
    return cache_dir() / "models" / "multihop"


@dataclass(frozen=True)
class DemoData:
    """The generated data of the demo (see `longdoc make-data multihop`)."""

    train_examples: int = 480  # one pass at the demo config's 120 steps of 2 x 2
    dev_examples: int = 40
    length: int = 768
    min_distance: int = 512
    # Bridge questions whose answer sentence lies past `min_distance`, no relation distractors (see
    # the module docstring).
    comparison_fraction: float = 0.0
    relation_share: float = 0.0
    chain_order: bool = True
    seed: int = 0  # the dev file is drawn with seed + 1: held-out worlds, never seen in training
    restricted_length: int = 512

    def __post_init__(self):
        if self.restricted_length >= self.length:
            raise OptionError("{restricted_length} {restricted} must be below {length} {whole}",
                              restricted=self.restricted_length, whole=self.length)
        if self.min_distance < self.restricted_length:
            # Otherwise the first `restricted_length` tokens could hold both facts.
            raise OptionError("{min_distance} {distance} must be at least {restricted_length} {restricted}",
                              distance=self.min_distance, restricted=self.restricted_length)


@dataclass
class DemoResult:
    runs: dict[str, Path]  # run name -> run folder (metrics.json, the model, dev_predictions.json)
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    leaderboard: str = ""
    question: str = ""  # the first held-out question, and its document as a plain text file
    document: Path | None = None


def first_tokens(records: list[dict], limit: int, tokenizer, generator: ModuleType) -> list[dict]:
    """HotpotQA records cut to the whole sentences (and titles) that fit, with `[CLS] question
    [SEP]` and the closing `[SEP]`, in `limit` wordpieces; paragraphs left empty are dropped.
    Counted by the generator's counter (`generator_of`), which matches the feature builder's layout exactly."""
    count = generator.wordpiece_counter(tokenizer)
    cut = []
    for record in records:
        budget = limit - 3 - count([record["question"]])[0]
        context = []
        for title, sentences in record["context"]:
            title_count, *sentence_counts = count([title, *sentences])
            if title_count + (sentence_counts[0] if sentences else 0) > budget:
                break
            budget -= title_count
            kept = []
            for sentence, sentence_count in zip(sentences, sentence_counts):
                if sentence_count > budget:
                    break
                kept.append(sentence)
                budget -= sentence_count
            context.append([title, kept])
            if len(kept) < len(sentences):
                break
        cut.append({**record, "context": context})
    return cut


def write_data(folder: Path, data: DemoData, tokenizer, generator: ModuleType, progress: bool = True,
               cut: tuple[str, ...] = ("train", "dev")) -> dict[str, Path]:
    """Write train.json, dev.json and the cuts of the `cut` splits to the first `restricted_length` wordpieces.

    The files are drawn by `generator` (`generator_of`) and written atomically; the dev file is
    drawn with `data.seed + 1`, the training file with `data.seed`.

    Args:
        folder: where the files are written.
        data: what to generate: example counts, document length, seed, `restricted_length`.
        tokenizer: the tokenizer whose wordpieces the generator and the cuts count.
        generator: the multihop task's generator module.
        progress: show the generator's progress bars.
        cut: the splits also written cut to their first `data.restricted_length` wordpieces
            (`first_tokens`).

    Returns:
        The paths written, keyed "train", "dev", and "train-restricted", "dev-restricted" for the
        splits in `cut`.
    """
    from longdoc.io import atomic_write_json

    paths = {}
    for split, n, seed in (("train", data.train_examples, data.seed), ("dev", data.dev_examples, data.seed + 1)):
        records = generator.make_examples(n, seed=seed, length=data.length, min_distance=data.min_distance,
                                comparison_fraction=data.comparison_fraction, relation_share=data.relation_share,
                                chain_order=data.chain_order, tokenizer=tokenizer, progress=progress)
        paths[split] = folder / f"{split}.json"
        atomic_write_json(paths[split], records, indent=None)
        if split not in cut:
            continue
        paths[f"{split}-restricted"] = folder / f"{split}-first{data.restricted_length}.json"
        atomic_write_json(paths[f"{split}-restricted"], first_tokens(records, data.restricted_length, tokenizer, generator),
                          indent=None)
    return paths


def write_document(record: dict, path: Path) -> Path:
    """A HotpotQA record's context as a plain text file: each paragraph its title line, then its
    sentences, paragraphs apart by a blank line."""
    from longdoc.io import atomic_write_text

    atomic_write_text(path, "\n\n".join(f"{title}\n{''.join(sentences)}" for title, sentences in record["context"])
                      + "\n")
    return path


def evaluate_restricted(task, model_dir: Path, dev: Path, out: Path, restricted_length: int,
                        full_dev: Path) -> dict[str, float]:
    """The trained model of `model_dir` predicting on the cut dev file, scored by the task's official metric.

    The predictions and metrics.json are written in `out`: a leaderboard row, ranked beside the runs
    on `full_dev` (the gold it was derived from).

    Args:
        task: the multihop task.
        model_dir: the trained model's folder.
        dev: the cut dev file, each example cut to its first `restricted_length` wordpieces.
        out: the run folder written (created if missing).
        restricted_length: the wordpieces each example was cut to, recorded in metrics.json.
        full_dev: the dev file `dev` was made from.

    Returns:
        The metric's scores by name.
    """
    from longdoc.evaluate.leaderboard import write_metrics_json
    from longdoc.model_folder import load_model
    from longdoc.train.finetune import DEV_PREDICTIONS_FILE, predict_and_score

    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer = load_model(model_dir, task.load("model"))
    metrics = predict_and_score(task, model, dev, out / DEV_PREDICTIONS_FILE, tokenizer)
    write_metrics_json(out, task=task.name, split="dev", model=f"{model_dir} (first {restricted_length} wordpieces)",
                       config={"model": str(model_dir), "dev": str(dev), "restricted_length": restricted_length},
                       metrics=metrics, gold=dev,
                       derived_from=(full_dev, f"each example cut to its first {restricted_length} wordpieces"))
    return metrics


def run_demo(tasks: TaskLookup, out: Path, data: DemoData = DemoData(), overrides: Mapping[str, Any] | None = None,
             config: str | Path | None = CONFIG_NAME, model_dir: Path | None = None,
             progress: bool = True) -> DemoResult:
    """Steps 1-5 of the module docstring in `out`: data/, full/ and first-N/.

    Rerun on the same `out`, a finished run is only evaluated again (the engine resumes from its
    folder).

    Args:
        tasks: the registry; its multihop task is the one trained.
        out: the folder of the demo's data and runs.
        data: the generated data's settings.
        overrides: engine options over the config's (as on `longdoc train`'s command line); None:
            none.
        config: the training options file, a path or the name of one the task ships (the demo's,
            tasks/multihop/configs/demo.json); None: the defaults.
        model_dir: where the whole-document model is copied, with a model card; None: not copied.
        progress: show the progress bars.

    Returns:
        DemoResult: the two runs' folders and metrics, their leaderboard, and the first held-out
        question with its document as a plain text file.

    Raises:
        KeyboardInterrupt: the training run was interrupted.
    """
    from longdoc.convert.pretrained import default_model_path
    from longdoc.evaluate.leaderboard import build_leaderboards, find_runs, leaderboards_markdown
    from longdoc.io import read_json
    from longdoc.io import atomic_write_text
    from longdoc.model_folder import MODEL_CARD, copy_model, read_tokenizer
    from longdoc.train.finetune import train_task
    from longdoc.train.options import resolve_task_options

    out = Path(out)
    (out / "data").mkdir(parents=True, exist_ok=True)
    task = tasks.get(TASK_NAME)
    overrides = dict(overrides or {})
    tokenizer = read_tokenizer(overrides.get("init") or default_model_path())
    paths = write_data(out / "data", data, tokenizer, generator_of(task), progress, cut=("dev",))  # the model trains on whole documents
    restricted = RESTRICTED_RUN.format(length=data.restricted_length)
    result = DemoResult(runs={FULL_RUN: out / FULL_RUN, restricted: out / restricted})
    print(f"longdoc demo: training on documents of up to {data.length} wordpieces in {out / FULL_RUN}",
          file=sys.stderr)
    options, task_options = resolve_task_options(task, {**overrides, "train": paths["train"], "dev": paths["dev"],
                                               "out": out / FULL_RUN, "long_max_len": data.length}, config)
    trained = train_task(task, options, task_options)
    if trained.interrupted:
        raise KeyboardInterrupt
    result.metrics[FULL_RUN] = trained.metrics
    print(f"longdoc demo: the same model reading the first {data.restricted_length} wordpieces of each held-out "
          "document", file=sys.stderr)
    result.metrics[restricted] = evaluate_restricted(task, out / FULL_RUN, paths["dev-restricted"], out / restricted,
                                                     data.restricted_length, paths["dev"])
    result.leaderboard = leaderboards_markdown(build_leaderboards(find_runs(result.runs.values(), tasks), tasks,
                                                                  LEADERBOARD_COLUMNS))
    if model_dir is not None:
        copy_model(result.runs[FULL_RUN], model_dir)
        atomic_write_text(Path(model_dir) / MODEL_CARD, MODEL_CARD_TEXT.format(length=data.length))
    first = read_json(paths["dev"])[0]
    result.question, result.document = first["question"], write_document(first, out / "data" / "document.txt")
    return result
