"""Natural Questions examples and predictions as `longdoc serve --task nq` shows them
(longdoc.serve.views).

Per example: the question, the page's text with each annotator's long and short answers and each
prediction file's marked, and the official judgements of the example (`metric.judge_example`:
whether gold has a long / short answer by the annotator votes, whether the file predicts one,
whether it is correct, its scores, the short answer's ROUGE-L credit). The official figures are a
sweep over score thresholds of these judgements (`metric.sweep_thresholds`), not their mean.

The page is shown as its words: HTML tag tokens are left out, block tags (<P>, <Tr>, <Li>, ...)
become line breaks. A view reads the gold file again up to its example, so that the pages
(about 1 GB in the dev set) are never all held at once (the views last shown are kept:
longdoc.serve.views.VIEWS_KEPT).
"""

from dataclasses import dataclass
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Iterator, Sequence

from longdoc.serve.views import (
    BrowseParts, ExampleBrowser, ExampleRow, ExampleView, Mark, PredictionFile, RunResult, TextBlock, open_examples,
)
from longdoc.tasks.nq.gold import Document, GoldExample, gold_paths, iter_gold
from longdoc.tasks.nq.metric import (
    ExampleJudgement, gold_has_long_answer, gold_has_short_answer, judge_example, short_answer_text,
)
from longdoc.tasks.nq.predictions import Prediction, read_predictions
from longdoc.tasks.nq.spans import AnswerLabel, Span

_BLOCK_TAGS = frozenset({"p", "br", "div", "table", "tr", "ul", "ol", "li", "dl", "dt", "dd",
                         "h1", "h2", "h3", "h4", "h5", "h6"})
METRIC_KEYS = ("long_gold", "long_pred", "long_correct", "long_score", "short_gold", "short_pred", "short_correct",
               "short_score", "short_rouge_l")


def page_text(document: Document) -> tuple[str, list[tuple[int, int] | None]]:
    """The page's words joined by spaces (line breaks for block tags), and each token's characters in
    it (None for an HTML token)."""
    parts: list[str] = []
    places: list[tuple[int, int] | None] = []
    length, separator = 0, ""
    for token, is_html in zip(document.tokens, document.is_html):
        if is_html:
            tag = token.strip("</>").split("_", 1)[0].lower()
            if tag in _BLOCK_TAGS and length:
                separator = "\n"
            places.append(None)
            continue
        if length:
            parts.append(separator or " ")
            length += len(parts[-1])
        separator = ""
        places.append((length, length + len(token)))
        parts.append(token)
        length += len(token)
    return "".join(parts), places


def _span_mark(document: Document, places, span: Span, kind: str, run: int | None, note: str) -> list[Mark]:
    covered = [places[i] for i in document.token_indices(span) if i < len(places) and places[i] is not None]
    return [Mark(covered[0][0], covered[-1][1], kind, run, note)] if covered else []


def _answer_marks(document: Document, places, answer: AnswerLabel, run: int | None, note: str) -> list[Mark]:
    marks = [] if answer.long_span.is_null else _span_mark(document, places, answer.long_span, "long answer", run, note)
    for span in answer.short_spans:
        if not span.is_null:
            marks += _span_mark(document, places, span, "short answer", run, note)
    return marks


def _describe_span(span: Span) -> str:
    if span.is_null:
        return "none"
    if span.has_tokens:
        return f"tokens {span.start_token:g}-{span.end_token:g}"
    return f"bytes {span.start_byte:g}-{span.end_byte:g}"


def _describe_short(answer: AnswerLabel, document: Document | None) -> str:
    if answer.yes_no != "none":
        return answer.yes_no
    text = short_answer_text(answer, document)
    return repr(text) if text else "none"


def _right(judgement: ExampleJudgement) -> bool:
    long = judgement.long
    return long.is_correct if long.has_gold else not long.has_pred


def _metrics(judgement: ExampleJudgement) -> dict[str, float]:
    figures = {}
    for kind, stat in (("long", judgement.long), ("short", judgement.short)):
        figures.update({f"{kind}_gold": float(stat.has_gold), f"{kind}_pred": float(stat.has_pred),
                        f"{kind}_correct": float(stat.is_correct), f"{kind}_score": float(stat.score)})
    figures["short_rouge_l"] = judgement.short_rouge_l
    return figures


def _gold_summary(gold: GoldExample) -> str:
    shorts = [_describe_short(answer, gold.document) for answer in gold.annotations if answer.has_short_answer]
    if shorts:
        return shorts[0]
    return "long answer only" if any(answer.has_long_answer for answer in gold.annotations) else "no answer"


@dataclass(frozen=True)
class GoldEntry:
    """One gold example as the rows read it, and where its view reads it again."""

    gold: GoldExample
    path: Path  # the gold file (a shard) that holds it
    position: int  # its line among that file's examples


def _gold_entries(gold_path) -> Iterator[GoldEntry]:
    for path in gold_paths(gold_path):
        for position, gold in enumerate(iter_gold(path)):
            yield GoldEntry(gold, Path(path), position)


def _row(entry: GoldEntry, files: Sequence[PredictionFile], thresholds: tuple[int, int]
         ) -> tuple[ExampleRow, tuple[Path, int]]:
    gold = entry.gold
    runs = []
    for file in files:
        prediction: Prediction | None = file.predictions.get(gold.example_id)
        if prediction is None:
            runs.append(RunResult("", None, dict.fromkeys(METRIC_KEYS, 0.0)))
            continue
        judgement = judge_example(gold, prediction, *thresholds)
        summary = (f"long {_describe_span(prediction.answer.long_span)}; "
                   f"short {_describe_short(prediction.answer, gold.document)}")
        runs.append(RunResult(summary, _right(judgement), _metrics(judgement)))
    has_long = gold_has_long_answer(gold.annotations, thresholds[0])
    has_short = gold_has_short_answer(gold.annotations, thresholds[1])
    row = ExampleRow(id=str(gold.example_id), question=gold.question_text, gold=_gold_summary(gold),
                     facets={"gold long answer": "yes" if has_long else "no",
                             "gold short answer": "yes" if has_short else "no"},
                     runs=tuple(runs))
    # The view reads the example again from its place: the pages are never all held at once.
    return row, (entry.path, entry.position)


def _view(place: tuple[Path, int], files: Sequence[PredictionFile], thresholds: tuple[int, int]) -> ExampleView:
    path, position = place
    gold = next(islice(iter_gold(path), position, None))
    document = gold.document or Document((), (), None)
    text, token_places = page_text(document)
    marks = [mark for number, answer in enumerate(gold.annotations, start=1)
             for mark in _answer_marks(document, token_places, answer, None, f"annotator {number}")]
    run_fields = []
    for run, file in enumerate(files):
        prediction = file.predictions.get(gold.example_id)
        if prediction is None:
            run_fields.append((("prediction", "none"),))
            continue
        marks += _answer_marks(document, token_places, prediction.answer, run, "")
        judgement = judge_example(gold, prediction, *thresholds)
        run_fields.append((
            ("long answer", f"{_describe_span(prediction.answer.long_span)} (score {prediction.long_score:g}), "
                            f"{'correct' if judgement.long.is_correct else 'not correct'}"),
            ("short answer", f"{_describe_short(prediction.answer, gold.document)} "
                             f"(score {prediction.short_score:g}), "
                             f"{'correct' if judgement.short.is_correct else 'not correct'}"),
        ))
    fields = tuple((f"annotator {number}", f"long {_describe_span(answer.long_span)}; "
                                           f"short {_describe_short(answer, gold.document)}")
                   for number, answer in enumerate(gold.annotations, start=1))
    return ExampleView(id=str(gold.example_id), fields=fields, run_fields=tuple(run_fields), tables=(),
                       texts=(TextBlock("page", text, tuple(marks)),))


def open_browser(gold_path, pred_paths, long_non_null_threshold: int = 2, short_non_null_threshold: int = 2,
                 **metric_options) -> ExampleBrowser:
    """The examples of NQ gold (a file or a glob of shards) against official prediction files."""
    thresholds = (long_non_null_threshold, short_non_null_threshold)
    parts = BrowseParts(right_means="the long answer is correct, or none is predicted where gold has none",
                        metric_keys=METRIC_KEYS, read_predictions=read_predictions,
                        row=partial(_row, thresholds=thresholds), view=partial(_view, thresholds=thresholds),
                        totals_are_means=False)
    return open_examples(parts, _gold_entries(gold_path), pred_paths)
