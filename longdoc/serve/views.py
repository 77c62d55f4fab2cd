"""What the prediction browser shows, as typed records: the contract between a task's browse module
(`Task.browse`, tasks/NAME/browse.py) and `longdoc serve --task` (whose page renders these records
and knows no task).

A task's browse module defines `open_browser(gold_path, pred_paths, **metric_options) ->
ExampleBrowser`: the gold file's examples in gold order, each with its figures against each
prediction file as the task's official metric code computes them per example (so that their mean
is the official total where the total is a mean), and `view(id)`, one example in full: its texts
with the gold's and each prediction file's marks. It reads the gold and hands its examples with its
`BrowseParts` to `open_examples`, which reads the prediction files and their scores side files and
puts the rows and views together.
"""

from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from longdoc.data.prediction_scores import PredictionScores, read_scores


@dataclass(frozen=True)
class Mark:
    """Characters [start, end) of a text block, marked as what they are and whose."""

    start: int
    end: int
    kind: str  # what is marked, in words: "answer", "support", "long answer", "keyphrase", ...
    run: int | None  # None: the gold's; else the index of the prediction file that marks it
    note: str = ""  # shown on hover: which annotator, which rank


@dataclass(frozen=True)
class TextBlock:
    """A text of the example (a paragraph, a support document, a page) and its marks."""

    title: str
    text: str
    marks: tuple[Mark, ...] = ()


@dataclass(frozen=True)
class Table:
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    # The columns (indexes) whose cells are a fraction in [0, 1] written as a number ("" when none):
    # the page draws them as bars beside the number (a model's probabilities).
    bars: tuple[int, ...] = ()


@dataclass(frozen=True)
class Column:
    """One column of a table made from items (`table_of`): its heading and each item's cell; `bar`:
    the cells are fractions in [0, 1] (`fraction_cell`), drawn as bars."""

    title: str
    cell: Callable[[Any], str]
    bar: bool = False


def table_of(title: str, items: Iterable, columns: Sequence[Column]) -> Table:
    return Table(title, tuple(column.title for column in columns),
                 tuple(tuple(column.cell(item) for column in columns) for item in items),
                 tuple(number for number, column in enumerate(columns) if column.bar))


def fraction_cell(value: float | None) -> str:
    """A fraction as a bar column's cell holds it; "" for none."""
    return "" if value is None else f"{value:.4f}"


@dataclass(frozen=True)
class RunResult:
    """One example against one prediction file."""

    prediction: str  # the prediction in one line; "" when the file has none for this example
    right: bool | None  # as `ExampleBrowser.right_means` says; None when the file has no prediction for it
    metrics: dict[str, float]  # the per-example figures, by the browser's `metric_keys`


@dataclass(frozen=True)
class ExampleRow:
    """One example in the list: what is searched, filtered and sorted."""

    id: str
    question: str
    gold: str  # the gold answer in one line
    facets: dict[str, str]  # gold-side categories to filter by: answer type, level, ...
    runs: tuple[RunResult, ...]  # one per prediction file, in the order given

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ExampleView:
    """One example in full."""

    id: str
    fields: tuple[tuple[str, str], ...]  # (label, value) of the gold
    run_fields: tuple[tuple[tuple[str, str], ...], ...]  # (label, value) per prediction file
    tables: tuple[Table, ...]
    texts: tuple[TextBlock, ...]

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ExampleBrowser:
    right_means: str  # what a right prediction is, in words ("answer exact match")
    metric_keys: tuple[str, ...]  # the per-example figures, in display order
    # Whether each official total is the mean over the gold examples of the per-example figure of
    # the same key (HotpotQA, WikiHop, OpenKP); not for Natural Questions' threshold sweep.
    totals_are_means: bool
    rows: tuple[ExampleRow, ...]
    view: Callable[[str], ExampleView]  # KeyError for an id the gold does not hold


@dataclass(frozen=True)
class PredictionFile:
    """One prediction file as a task's browse module reads it."""

    predictions: Any  # as the task's metric reads the file
    scores: PredictionScores | None  # its scores side file; None for a task that writes none


@dataclass(frozen=True)
class BrowseParts:
    """A task's part of the prediction browser; `open_examples` does the rest."""

    right_means: str  # ExampleBrowser.right_means
    metric_keys: tuple[str, ...]
    read_predictions: Callable[[Path], Any]  # one prediction file, as the task's metric reads it
    # One gold example against every file: its row, and what its view needs of it (kept by id).
    row: Callable[[Any, Sequence[PredictionFile]], tuple[ExampleRow, Any]]
    view: Callable[[Any, Sequence[PredictionFile]], ExampleView]  # what `row` kept -> the example in full
    check_scores: Callable[[Mapping], str | None] | None = None  # read_scores' check; None: no side files
    totals_are_means: bool = True


VIEWS_KEPT = 16  # the views last shown, kept (a view can read the gold file again: Natural Questions')


def open_examples(parts: BrowseParts, gold: Iterable[Any], pred_paths: Sequence) -> ExampleBrowser:
    """The browser of the gold examples `gold` (the task's, each read once, in gold order) against the
    prediction files at `pred_paths` (and their scores side files)."""
    files = tuple(PredictionFile(parts.read_predictions(Path(path)),
                                 None if parts.check_scores is None else read_scores(path, parts.check_scores))
                  for path in pred_paths)
    rows, kept = [], {}
    for example in gold:
        row, needed = parts.row(example, files)
        rows.append(row)
        kept[row.id] = needed

    @lru_cache(maxsize=VIEWS_KEPT)
    def view(example_id: str) -> ExampleView:
        return parts.view(kept[example_id], files)

    return ExampleBrowser(right_means=parts.right_means, metric_keys=parts.metric_keys,
                          totals_are_means=parts.totals_are_means, rows=tuple(rows), view=view)
