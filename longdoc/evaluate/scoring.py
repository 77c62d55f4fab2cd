"""A task's official metric on two files, as every command runs it (`longdoc evaluate`, `longdoc
serve --task`, the dev evaluation of `longdoc train`): the metric's warnings are named by the task
asked for, which may run another task's metric (`Task.pipeline_of`: multihop scores with HotpotQA's)."""

import warnings

from longdoc.errors import OptionWarning
from longdoc.data.task import Task


def _named(task_name: str, warning: warnings.WarningMessage) -> Warning:
    message = warning.message
    if isinstance(message, OptionWarning):  # keeps the option names, which the command line shows as flags
        return OptionWarning(f"{task_name}: " + message.template, **message.values)
    return warning.category(f"{task_name}: {message}")


def score_files(task: Task, gold_path, pred_path, *, allow_missing: bool = False, **options) -> dict[str, float]:
    """`task`'s metric (`evaluate_files`) of the prediction file against the gold file, with its
    `options`; a prediction file whose ids differ from the gold's is refused unless `allow_missing`
    (longdoc.evaluate.ids). Its warnings are passed on, each starting with the task's name."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = task.load("metric").evaluate_files(gold_path, pred_path, allow_missing=allow_missing, **options)
    for warning in caught:
        warnings.warn(_named(task.name, warning), stacklevel=2)
    return metrics
