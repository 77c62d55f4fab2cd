"""The datasets longdoc knows: one package per dataset under tasks/ (installed as longdoc.tasks).

Each package's `__init__.py` defines `TASK`, a `Task` record that names the package's parts:

  reader    official file -> examples      read_examples(path) -> Iterator[StructuredExample]
  metric    the official metric            evaluate_files(gold_path, pred_path, **options) -> dict
  features  examples -> model inputs       training_features(path, tokenizer, config, options, progress=True)
                                             -> list[dict]
                                             one row per training window: model inputs and labels as
                                             Python ints/lists (see longdoc.model.inputs for the names)
                                           collate(rows, pad_token_id) -> dict[str, Tensor]
                                             a batch that goes straight into model(**batch)
  model     encoder + heads + loss         "module:Class", a TaskModel subclass (longdoc.model.task_model):
                                             Class.from_encoder(dir, **head_options) starts from a lifted
                                             encoder, from_pretrained(dir) restores a trained one,
                                             forward(**batch) -> typed output with .loss (when labels are given)
  decode    logits -> official file        predict(model, data_path, out_path, *, tokenizer, options,
                                                   batch_size, progress=True) -> PredictionFile
                                             (longdoc.data.prediction: the path and the examples in it)
  configs   shipped hyperparameters        a folder of NAME.json files (published settings, a small CPU one),
                                             each holding training options by their long names
  browse    the prediction browser         open_browser(gold_path, pred_paths, **metric options)
                                             -> longdoc.serve.views.ExampleBrowser (`longdoc serve --task`)

`options` above is the resolved training options (longdoc.train), which include the task's own
`train_options` (for example NQ's rate of answerless windows kept in training).

Parts are named by module path and imported on first use (`Task.load`), so listing the tasks, as
`longdoc --help` does, never imports torch. The registry finds the packages under tasks/ by name
(nothing is imported until a task is asked for) and takes further tasks through `register`
(`unregister` takes them out again);
adding a dataset means adding one package here and nothing else.
"""

import importlib
import json
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Option:
    """One option a task adds to a command (`longdoc evaluate TASK`, `longdoc train TASK`) as `--NAME`."""

    name: str  # the keyword it is passed as, e.g. long_non_null_threshold
    type: type
    default: Any
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class Task:
    """Everything the library and the command line know about one dataset."""

    name: str
    description: str  # one line, for --help
    reader: str  # module path
    metric: str  # module path
    headline_metric: str  # the key the leaderboard ranks by
    # published figures: {"name", "source", "measured_on": {"set", "files", "examples"}, "metrics": {key: value}}
    reference_rows: tuple[dict, ...] = ()
    metric_options: tuple[Option, ...] = ()  # evaluate_files' keywords, offered by `longdoc evaluate`
    # The task's own training/feature options, offered by `longdoc train`; those its model takes as
    # task_options are stored in the trained model's config.json, so prediction uses the same values.
    train_options: tuple[Option, ...] = ()
    # The pipeline, as each task's lands (None: this task cannot be trained or predicted yet).
    features: str | None = None  # module path
    model: str | None = None  # "module.path:ClassName"
    decode: str | None = None  # module path
    configs: Path | None = None  # folder of shipped hyperparameter files (name.json)
    browse: str | None = None  # module path: examples and predictions as `longdoc serve --task` shows them
    extras: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def in_package(cls, package: str, *, model_class: str, **fields) -> "Task":
        """The task named as its package (tasks/NAME) whose parts are the package's usual modules
        (reader, metric, features, model with its class `model_class`, decode), whose configs are its
        configs/ folder and whose published figures its published.json holds (when there is one:
        {"note", "measured_on": {"set", "files", "examples"}, "rows": [{"name", "source", "metrics"}]})."""
        folder = Path(importlib.import_module(package).__file__).parent
        published = folder / "published.json"
        if published.is_file():
            figures = json.loads(published.read_text(encoding="utf-8"))
            fields["reference_rows"] = tuple({**row, "measured_on": figures["measured_on"]} for row in figures["rows"])
        return cls(name=package.rpartition(".")[2], reader=f"{package}.reader", metric=f"{package}.metric",
                   features=f"{package}.features", model=f"{package}.model:{model_class}",
                   decode=f"{package}.decode", configs=folder / "configs", browse=f"{package}.browse", **fields)

    def load(self, part: str):
        """The module (or `module:attribute`) a part names, imported now."""
        reference = getattr(self, part)
        if reference is None:
            raise LookupError(f"task {self.name!r} has no {part} yet")
        module_name, _, attribute = reference.partition(":")
        module = importlib.import_module(module_name)
        return getattr(module, attribute) if attribute else module

    def metric_defaults(self) -> dict[str, Any]:
        return {option.name: option.default for option in self.metric_options}

    def train_defaults(self) -> dict[str, Any]:
        return {option.name: option.default for option in self.train_options}


_registered: dict[str, Task] = {}


def register(task: Task) -> Task:
    """Add a task to the registry; a name already taken is an error."""
    if task.name in _registered:
        raise ValueError(f"a task named {task.name!r} is already registered")
    _registered[task.name] = task
    return task


def unregister(name: str) -> Task:
    """Take a task out of the registry (a test's own task, after the test); KeyError when none has
    that name. A built-in task comes back at the next lookup."""
    return _registered.pop(name)


def _builtin_names() -> list[str]:
    return sorted(module.name for module in pkgutil.iter_modules(__path__) if module.ispkg)


def _load_builtins() -> None:
    for name in _builtin_names():
        if name not in _registered:
            task = importlib.import_module(f"{__name__}.{name}").TASK
            if task.name != name:
                raise ValueError(f"tasks/{name}/__init__.py registers a task named {task.name!r}; use {name!r}")
            register(task)


def task_names() -> list[str]:
    _load_builtins()
    return list(_registered)


def get_task(name: str) -> Task:
    """The task registered under `name`; a KeyError that lists the known names otherwise."""
    _load_builtins()
    if name not in _registered:
        raise KeyError(f"unknown task {name!r}; known tasks: {', '.join(_registered)}")
    return _registered[name]
