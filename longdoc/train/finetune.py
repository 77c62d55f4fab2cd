"""`train_task(task, options)`: a task model trained on the engine, from a Task record's parts.

The job it builds: tokenizer and encoder from `--init` (default: the packaged MiniLM lifted with
`--init-positions`), the encoder switches of this run (`--residual-attention`, `--talking-heads`,
lengths) applied at `Class.from_encoder`, the task's own options that are model options stored in
its config; rows from `features.training_features(train, tokenizer, model.config, options)`; evaluation as
`decode.predict` on `--dev` followed by the task's official metric. At the end --out holds the
final model and its tokenizer (`longdoc predict TASK --model OUT`), `dev_predictions.json`,
`metrics.json`, `train_log.jsonl` and `train_options.json` (the resolved options).
"""

import functools
from pathlib import Path
from typing import Any, Mapping

from longdoc.errors import InputError
from longdoc.task import Task
from longdoc.train.options import ENCODER_SWITCHES, options_json

DEV_PREDICTIONS_FILE = "dev_predictions.json"


def _check_files(options: Mapping[str, Any]) -> None:
    for name in ("train", "dev"):
        path = options.get(name)
        if path is not None and not Path(path).exists():  # a file, or a datasets save_to_disk folder
            raise InputError(f"--{name} {path}: no such file or folder")


def predict_and_score(task: Task, model, dev: Path, predictions_path: Path, tokenizer,
                      options: Mapping[str, Any] | None = None, batch_size: int = 8,
                      progress: bool = True) -> dict[str, float]:
    """`model`'s official prediction file for the `dev` file (`decode.predict`, written to
    `predictions_path`), scored by the task's official metric at its default options."""
    predictions = task.load("decode").predict(model, dev, predictions_path, tokenizer=tokenizer, options=options,
                                              batch_size=batch_size, progress=progress)
    return task.load("metric").evaluate_files(dev, predictions.path, **task.metric_defaults())


def build_task_job(task: Task, options: Mapping[str, Any], progress: bool = True):
    """The TrainingJob of `longdoc train TASK` with resolved `options`; `progress`: show the training
    and dev prediction progress bars."""
    import torch

    from longdoc.convert.checkpoint import read_tokenizer
    from longdoc.convert.pretrained import initial_weights
    from longdoc.train.engine import TrainingJob

    for part in ("features", "model", "decode"):
        if getattr(task, part) is None:
            raise InputError(f"the {task.name} task cannot be trained yet: it has no {part}")
    _check_files(options)
    init = initial_weights(options)
    tokenizer = read_tokenizer(init)
    model_class = task.load("model")
    features = task.load("features")
    encoder_config = {name: options[name] for name in ENCODER_SWITCHES if options.get(name) is not None}
    model_options = {option.name: options[option.name] for option in task.train_options
                     if option.name in model_class.default_task_options}
    torch.manual_seed(options["seed"])  # the fresh heads: the same on every process and every rerun
    model = model_class.from_encoder(init, encoder_config=encoder_config, **model_options)
    rows = features.training_features(options["train"], tokenizer, model.config, options, progress=progress)
    collate = functools.partial(features.collate, pad_token_id=model.config.pad_token_id)

    evaluate = None
    if options.get("dev") is not None:

        def evaluate(trained, folder: Path) -> dict[str, float]:
            return predict_and_score(task, trained, options["dev"], folder / DEV_PREDICTIONS_FILE, tokenizer,
                                     options, batch_size=options.get("eval_batch_size") or options["batch_size"],
                                     progress=progress)

    def save_model(trained, folder: Path, state_dict: dict) -> None:
        trained.save_pretrained(folder, state_dict=state_dict, safe_serialization=True)
        tokenizer.save_pretrained(folder)

    return TrainingJob(name=task.name, model=model, rows=rows, collate=collate, out_dir=Path(options["out"]),
                       options=options, evaluate=evaluate, save_model=save_model, progress=progress)


def train_task(task: Task, options: Mapping[str, Any], progress: bool = True):
    """Train `task` with resolved `options` (longdoc.train.options); returns the engine's TrainingResult.
    Rank 0 writes metrics.json at the end (when --dev is given)."""
    from longdoc.train.engine import run_training

    out = Path(options["out"])
    job = build_task_job(task, options, progress)
    result = run_training(job)
    if result.is_main and not result.interrupted and result.metrics:
        from longdoc.evaluate.leaderboard import write_metrics_json

        write_metrics_json(out, task=task.name, split="dev", model=str(out), config=options_json(options),
                           metrics=result.metrics, gold=options["dev"])
    return result
