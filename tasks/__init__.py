"""The datasets longdoc knows, one package each under tasks/ (installed as longdoc.tasks).

Every task package has the same parts, each in its own module:
  reader.py   official file -> examples
  metric.py   the official metric: `evaluate_files(gold_path, pred_path, **options) -> dict`
(features, head and decode join them as the task pipelines land). The registry below is the one
place that names them: adding a dataset means adding a package and a line here.
"""

import importlib
from types import ModuleType

REGISTRY = {
    "hotpotqa": "longdoc.tasks.hotpotqa",
    "wikihop": "longdoc.tasks.wikihop",
    "nq": "longdoc.tasks.nq",
    "openkp": "longdoc.tasks.openkp",
}


def get_task(name: str) -> ModuleType:
    """The task package registered under `name`."""
    if name not in REGISTRY:
        raise KeyError(f"unknown task {name!r}; known tasks: {', '.join(REGISTRY)}")
    return importlib.import_module(REGISTRY[name])
