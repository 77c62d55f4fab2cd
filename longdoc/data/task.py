"""The Task contract: what a dataset package gives the library, and the registry that names the tasks.

The library knows no dataset by name. A dataset is a package under tasks/ (installed as
longdoc.tasks) whose `__init__.py` defines `TASK`, a `Task` record naming its parts by module path:

  reader    official file -> examples      read_examples(path) -> Iterator[StructuredExample]
  metric    the official metric            evaluate_files(gold_path, pred_path, *, allow_missing=False,
                                                          **options) -> dict; a prediction file whose ids
                                             differ from the gold's is refused unless allow_missing
                                             (longdoc.evaluate.ids: check_prediction_ids)
  features  examples -> model inputs       training_features(path, tokenizer, config, options, progress=True)
                                             -> list[dict]: one row per training window, model inputs
                                             and labels as Python ints/lists (longdoc.model.inputs names them)
                                           collate(rows, pad_token_id) -> dict[str, Tensor], a batch that
                                             goes straight into model(**batch)
  model     encoder + heads + loss         "module:Class", a TaskModel subclass (longdoc.model.task_model)
  decode    logits -> official file        predict(model, data_path, out_path, *, tokenizer, options, tune,
                                                   batch_size, progress=True) -> PredictionFile; beside the
                                             official file, the scores its format has no room for
                                             (longdoc.data.prediction_scores), unless it holds them
  ask       reading passages for `ask`     a module with the functions of `SpanAnswerReading` (optional:
                                             a task without one answers no `longdoc ask`)
  configs   shipped hyperparameters        a folder of NAME.json files, training options by long name
  browse    the prediction browser         open_browser(gold_path, pred_paths, **metric options)
                                             -> longdoc.serve.views.ExampleBrowser (`longdoc serve --task`;
                                             optional: a task without one has no browser); it shows the
                                             scores beside each prediction file when there are some

The protocols below state each part's functions; one test checks every registered task against
them. `options` is the task's options record (`Task.options`, a frozen dataclass of
`longdoc.data.options` fields, e.g. the window stride): `longdoc train TASK` offers its fields as flags,
the model keeps those it stores in its config (`task_options`), where the decoder reads them when
it is given no options record (`longdoc predict`).

A task may run another task's pipeline on data of its own (the built-in multihop generator writes
HotpotQA's format): `Task(name=..., pipeline_of="other", ...)` names the other task, and the
registry gives it the other task's parts, keeping its own name, description, headline metric,
published figures, configs and extras.

The registry (`TaskRegistry`) is an explicit list: tasks/__init__.py registers each built-in task by
name with the `registry.task(NAME)` decorator, on a function that imports and returns its record,
so listing the names imports no task and a task is imported when it is first asked for. A name
registered twice is an error. The command line (longdoc/cli.py, longdoc/commands/) holds the
registry and hands it to the library functions that look tasks up (`TaskLookup`).
"""

import dataclasses
import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Protocol, Sequence, runtime_checkable

from longdoc.data.options import Option, options_of

if TYPE_CHECKING:
    from torch import Tensor

    from longdoc.data.examples import Document, StructuredExample, TextSpan
    from longdoc.data.features import FeatureSettings, Features
    from longdoc.data.prediction import PredictionFile, WindowScores


@dataclass(frozen=True)
class Task:
    """Everything the library and the command line know about one dataset."""

    name: str
    description: str  # one line, for --help
    headline_metric: str  # the key the leaderboard ranks by
    reader: str | None = None  # module path
    metric: str | None = None  # module path
    # published figures: {"name", "source", "measured_on": {"set", "files", "examples"}, "metrics": {key: value}}
    reference_rows: tuple[dict, ...] = ()
    metric_options: tuple[Option, ...] = ()  # evaluate_files' keywords, offered by `longdoc evaluate`
    # The task's options record (a frozen dataclass of longdoc.data.options fields), offered by `longdoc
    # train`; those its model stores are kept in the trained model's config.json, so that prediction
    # uses the same values.
    options: type | None = None
    # The pipeline, as each task's lands (None: this task cannot be trained or predicted yet).
    features: str | None = None  # module path
    model: str | None = None  # "module.path:ClassName"
    decode: str | None = None  # module path
    ask: str | None = None  # module path of the SpanAnswerReading functions
    browse: str | None = None  # module path: examples and predictions as `longdoc serve --task` shows them
    configs: Path | None = None  # folder of shipped hyperparameter files (name.json)
    extras: dict[str, Any] = field(default_factory=dict)
    pipeline_of: str | None = None  # the task whose parts this one runs (see the module docstring)

    @classmethod
    def in_package(cls, package: str, *, model_class: str, **fields) -> "Task":
        """The task named as its package (tasks/NAME) whose parts are the package's usual modules
        (reader, metric, features, model with its class `model_class`, decode, browse), whose configs are its
        configs/ folder and whose published figures its published.json holds (when there is one:
        {"note", "measured_on": {"set", "files", "examples"}, "rows": [{"name", "source", "metrics"}]})."""
        folder = Path(importlib.import_module(package).__file__).parent
        published = folder / "published.json"
        if published.is_file():
            figures = json.loads(published.read_text(encoding="utf-8"))
            fields["reference_rows"] = tuple({**row, "measured_on": figures["measured_on"]} for row in figures["rows"])
        return cls(name=package.rpartition(".")[2], reader=f"{package}.reader", metric=f"{package}.metric",
                   features=f"{package}.features", model=f"{package}.model:{model_class}",
                   decode=f"{package}.decode", browse=f"{package}.browse", configs=folder / "configs", **fields)

    def load(self, part: str):
        """The module (or `module:attribute`) a part names, imported now."""
        reference = getattr(self, part)
        if reference is None:
            raise LookupError(f"task {self.name!r} has no {part} yet")
        module_name, _, attribute = reference.partition(":")
        module = importlib.import_module(module_name)
        return getattr(module, attribute) if attribute else module

    @property
    def train_options(self) -> tuple[Option, ...]:
        """The fields of the task's options record, as options."""
        return () if self.options is None else options_of(self.options)

    def default_options(self) -> Any:
        """The task's options record at its defaults; None for a task without options."""
        return None if self.options is None else self.options()

    def metric_defaults(self) -> dict[str, Any]:
        return {option.name: option.default for option in self.metric_options}

    def running(self, base: "Task") -> "Task":
        """This task with the parts of `base`, the task named in `pipeline_of`."""
        own = ("name", "description", "headline_metric", "reference_rows", "configs", "extras", "pipeline_of")
        return dataclasses.replace(base, **{name: getattr(self, name) for name in own})


class TaskLookup(Protocol):
    """How the library finds tasks: the registry, handed over by the command line."""

    def names(self) -> list[str]: ...

    def get(self, name: str) -> Task: ...


class TaskRegistry:
    """The tasks by name (see the module docstring): an explicit list, each name once."""

    def __init__(self):
        self._sources: dict[str, Callable[[], Task]] = {}
        self._tasks: dict[str, Task] = {}

    def task(self, name: str) -> Callable[[Callable[[], Task]], Callable[[], Task]]:
        """Decorator: `function()` returns the record of the task `name`, imported when first asked for."""

        def add(function: Callable[[], Task]) -> Callable[[], Task]:
            self._claim(name)
            self._sources[name] = function
            return function

        return add

    def register(self, task: Task) -> Task:
        """Add a task record (a task of one's own, a test's); a name already taken is an error."""
        self._claim(task.name)
        self._sources[task.name] = lambda: task
        return task

    def unregister(self, name: str) -> None:
        """Take a task out of the registry (a test's own task, after the test); KeyError when none has that name."""
        del self._sources[name]
        self._tasks.pop(name, None)

    def _claim(self, name: str) -> None:
        if name in self._sources:
            raise ValueError(f"a task named {name!r} is already registered")

    def names(self) -> list[str]:
        """The registered names, in registration order (nothing is imported)."""
        return list(self._sources)

    def get(self, name: str) -> Task:
        """The task registered under `name`; a KeyError that lists the known names otherwise."""
        if name not in self._sources:
            raise KeyError(f"unknown task {name!r}; known tasks: {', '.join(self._sources)}")
        if name not in self._tasks:
            task = self._sources[name]()
            if task.name != name:
                raise ValueError(f"the task registered as {name!r} is named {task.name!r}")
            if task.pipeline_of is not None:
                if task.pipeline_of == name:
                    raise ValueError(f"task {name!r} names itself in pipeline_of")
                task = task.running(self.get(task.pipeline_of))
            self._tasks[name] = task
        return self._tasks[name]

    def __iter__(self) -> Iterator[Task]:
        return (self.get(name) for name in self.names())


# The parts' functions (module-level functions of the modules a Task names).

@runtime_checkable
class ReaderPart(Protocol):
    def read_examples(self, path) -> Iterable[Any]: ...


@runtime_checkable
class MetricPart(Protocol):
    def evaluate_files(self, gold_path, pred_path, *, allow_missing: bool = False, **options) -> dict[str, float]: ...


@runtime_checkable
class FeaturesPart(Protocol):
    def training_features(self, path, tokenizer, config, options=None, progress: bool = True) -> Sequence[dict]:
        """Every training row of the file `path`; `options`: the task's options record (None: its defaults)."""

    def collate(self, rows: Sequence[dict], pad_token_id: int) -> dict[str, "Tensor"]: ...


@runtime_checkable
class DecodePart(Protocol):
    def predict(self, model, data_path, out_path, *, tokenizer, options=None, tune: bool = False,
                batch_size: int = 8, progress: bool = True) -> "PredictionFile":
        """The official prediction file of `data_path`, written to `out_path`. `options`: the task's
        options record (None: the values the model stores); `tune`: the file has gold labels
        and the decoder may choose its settings on them (the dev file of a training run); what it
        chose is in the result's `chosen`, for the caller to keep."""


@runtime_checkable
class SpanAnswerReading(Protocol):
    """What `longdoc ask` reads with a trained task model whose answers are spans of the passages
    (with their supporting sentences): the passages become one example of documents (one per
    passage, paragraphs of sentences), read in the task's windows by its model."""

    def passages_example(self, question: str, documents: Sequence["Document"]) -> "StructuredExample":
        """The example the model reads: the question and the passages as its documents, in order."""

    def feature_settings(self, config) -> "FeatureSettings": ...

    def window_inputs(self, example: "StructuredExample", window: "Features") -> dict[str, Any]:
        """The model inputs of one window of the example (no labels)."""

    def collate(self, rows: Sequence[dict], pad_token_id: int) -> dict[str, "Tensor"]: ...

    def fixed_answer(self, windows: Sequence["WindowScores"]) -> tuple[str | None, float]:
        """(an answer that is no span, such as "yes", and its probability) when the model gives one;
        else (None, the probability that the answer is a span)."""

    def window_spans(self, window: "WindowScores", max_answer_length: int, k: int) -> list[tuple[float, int, int]]:
        """The k best (score, first, last) long-token spans of one window where an answer may lie."""

    def char_span(self, features: "Features", first: int, last: int) -> "TextSpan | None":
        """The characters of long tokens first..last in the example; None across documents."""

    def sentence_probabilities(self, windows: Sequence["WindowScores"]) -> Mapping[int, float]:
        """{sentence (flat index over the example's documents): supporting-sentence probability}."""

    def support_threshold(self, model) -> float:
        """The supporting-sentence probability a sentence needs to be shown as support."""

    def max_answer_length(self, model) -> int:
        """The longest answer span, in wordpieces, the model decodes."""


@runtime_checkable
class BrowsePart(Protocol):
    def open_browser(self, gold_path, pred_paths, **metric_options) -> Any:
        """The gold file's examples beside each prediction file's (a longdoc.serve.views.ExampleBrowser)."""


# Each part and the protocol its module follows.
PART_PROTOCOLS: Mapping[str, type] = {
    "reader": ReaderPart, "metric": MetricPart, "features": FeaturesPart, "decode": DecodePart,
    "ask": SpanAnswerReading, "browse": BrowsePart,
}
