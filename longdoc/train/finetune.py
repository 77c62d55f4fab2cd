"""`train_task(task, options, task_options)`: a task model trained on the engine, from a Task record's parts.

The job it builds: tokenizer and encoder from `init` (default: the packaged MiniLM lifted with
`init_positions`), the encoder switches of this run (residual attention, talking heads, lengths)
applied at `Class.from_encoder`, the task's options that its model stores kept in its config; rows
from `features.training_features(train, tokenizer, model.config, task_options)`, built once and
reused by later runs with the same data, tokenizer and settings (`training_rows`, through
longdoc.data.feature_cache, under `cache_dir()/features`); evaluation as
`decode.predict` on the dev file (tuning what the decoder chooses there, which the model then keeps)
followed by the task's official metric. At the end the output folder holds the final model and its
tokenizer (`longdoc predict TASK --model OUT`), `dev_predictions.json`, `metrics.json`,
`train_log.jsonl` and `train_options.json` (the resolved options).
"""

import functools
from pathlib import Path
from typing import Any

from longdoc.errors import InputError, OptionError
from longdoc.data.task import Task
from longdoc.train.options import TrainingOptions, recorded_options

DEV_PREDICTIONS_FILE = "dev_predictions.json"


def _check_files(options: TrainingOptions) -> None:
    for name in ("train", "dev"):
        path = getattr(options, name)
        if path is not None and not Path(path).exists():  # a file, or a datasets save_to_disk folder
            raise OptionError("{%s} {path}: no such file or folder" % name, path=path)


def predict_and_score(task: Task, model, dev: Path, predictions_path: Path, tokenizer, options: Any = None,
                      tune: bool = False, batch_size: int = 8, progress: bool = True) -> dict[str, float]:
    """`model`'s official prediction file for the `dev` file, scored by the task's official metric.

    The task's `decode.predict` writes the prediction file; the task's metric scores it against
    `dev` at the metric's default options. With `tune`, what the decoder chose on the file is kept
    in the model's config (`config.task_options`).

    Args:
        task: the task whose decoder and metric run.
        model: the task's model, as it predicts.
        dev: the dev file in the task's official format, the gold file of the metric.
        predictions_path: where the official prediction file is written.
        tokenizer: the model's tokenizer.
        options: the task's options record for `decode.predict` (a training run's); None: its
            defaults.
        tune: let the decoder choose its settings on this file (e.g. HotpotQA's `sp_threshold`).
        batch_size: rows per batch when predicting.
        progress: show the prediction's progress bar.

    Returns:
        The metric's scores by name.
    """
    predictions = task.load("decode").predict(model, dev, predictions_path, tokenizer=tokenizer, options=options,
                                              tune=tune, batch_size=batch_size, progress=progress)
    model.config.task_options.update(predictions.chosen)
    from longdoc.evaluate.scoring import score_files

    return score_files(task, dev, predictions.path, **task.metric_defaults())


def training_rows(task: Task, path: Path, tokenizer, config, task_options: Any = None, progress: bool = True):
    """The task's training rows of the file `path`, from the feature cache when a run built the same ones before.

    The rows are the task's `features.training_features` of the file; the cache key holds the data
    file's digest, the tokenizer's, the config's values, the task options and the code that builds
    rows (the task's package, the library's data package, the input schema).

    Args:
        task: the task whose features are built.
        path: the training file in the task's official format.
        tokenizer: the model's tokenizer.
        config: the encoder's config (lengths and input conventions the features follow).
        task_options: the task's options record, given to the features; None: their defaults.
        progress: show the feature builder's progress bar and say on stderr whether the rows came
            from the cache or were built.

    Returns:
        The feature rows, each a dict of a task's features.
    """
    import longdoc.data
    import longdoc.model.inputs
    from longdoc.data.feature_cache import (
        FeatureKey, cached_rows, config_values, data_digest, say_on_stderr, source_digest, tokenizer_digest,
    )
    from longdoc.data.options import json_values, record_values

    features = task.load("features")
    # The code that builds rows: the task's package, the library's data package, the input schema.
    sources = (Path(features.__file__).parent, Path(longdoc.data.__file__).parent,
               Path(longdoc.model.inputs.__file__))
    key = FeatureKey(task=task.features, data=data_digest(path), tokenizer=tokenizer_digest(tokenizer),
                     config=config_values(config),
                     options={} if task_options is None else json_values(record_values(task_options)),
                     code=source_digest(sources))
    return cached_rows(lambda: features.training_features(path, tokenizer, config, task_options, progress=progress),
                       key, feature_cache_folder(), describe=f"longdoc train: {path}",
                       say=say_on_stderr if progress else None)


def feature_cache_folder() -> Path:
    """Where training rows are cached: `cache_dir()/features` ($LONGDOC_CACHE, else ~/.cache/longdoc)."""
    from longdoc.model.cache import cache_dir

    return cache_dir() / "features"


def build_task_job(task: Task, options: TrainingOptions, task_options: Any = None, progress: bool = True):
    """The TrainingJob of `longdoc train TASK` with resolved `options` and the task's options record
    (None: its defaults); `progress`: show the training and dev prediction progress bars."""
    import torch

    from longdoc.model_folder import read_tokenizer, save_model
    from longdoc.convert.pretrained import initial_weights
    from longdoc.data.options import record_values
    from longdoc.train.engine import TrainingJob

    for part in ("features", "model", "decode"):
        if getattr(task, part) is None:
            raise InputError(f"the {task.name} task cannot be trained yet: it has no {part}")
    _check_files(options)
    task_options = task.default_options() if task_options is None else task_options
    init = initial_weights(options)
    tokenizer = read_tokenizer(init)
    model_class = task.load("model")
    features = task.load("features")
    stored = {} if task_options is None else record_values(task_options)
    model_options = {name: value for name, value in stored.items() if name in model_class.default_task_options}
    torch.manual_seed(options.seed)  # the fresh heads: the same on every process and every rerun
    model = model_class.from_encoder(init, encoder_config=options.encoder_settings(), **model_options)
    rows = training_rows(task, options.train, tokenizer, model.config, task_options, progress)
    collate = functools.partial(features.collate, pad_token_id=model.config.pad_token_id)

    evaluate = None
    if options.dev is not None:

        def evaluate(trained, folder: Path) -> dict[str, float]:
            return predict_and_score(task, trained, options.dev, folder / DEV_PREDICTIONS_FILE, tokenizer,
                                     task_options, tune=True, batch_size=options.eval_batch_size or options.batch_size,
                                     progress=progress)

    def save(trained, folder: Path, state_dict: dict) -> None:
        save_model(folder, trained, tokenizer, state_dict=state_dict)

    return TrainingJob(name=task.name, model=model, rows=rows, collate=collate, out_dir=Path(options.out),
                       options=options, evaluate=evaluate, save_model=save, progress=progress,
                       task_options=task_options)


def train_task(task: Task, options: TrainingOptions, task_options: Any = None, progress: bool = True):
    """Train `task` with resolved `options` and its options record (longdoc.train.options); returns the
    engine's TrainingResult. Rank 0 writes metrics.json at the end (when a dev file is given)."""
    from longdoc.train.engine import run_training

    job = build_task_job(task, options, task_options, progress)
    result = run_training(job)
    if result.is_main and not result.interrupted and result.metrics:
        from longdoc.evaluate.leaderboard import write_metrics_json

        write_metrics_json(Path(options.out), task=task.name, split="dev", model=str(options.out),
                           config=recorded_options(options, job.task_options), metrics=result.metrics,
                           gold=options.dev)
    return result
