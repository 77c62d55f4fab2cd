"""WikiHop examples and predictions as `longdoc serve --task wikihop` shows them (longdoc.serve.views).

Per example: the query, the candidates (the gold answer and each prediction file's choice among
them, with each file's candidate probabilities, best first, when its scores side file is beside it),
the supporting documents with the mentions of the gold answer and of each file's choice marked (the
reader's mention rule, `reader.find_mentions`), other candidates' mentions marked apart, and the
example's accuracy (`metric.is_correct`; the mean over the gold is `longdoc evaluate`'s accuracy).
The official prediction file {id: answer} holds the chosen candidate only; the probabilities come
from PRED.scores.jsonl (`longdoc predict` writes it, longdoc.tasks.wikihop.decode says what it holds),
and a file without one is said to have no scores.
"""

from typing import Mapping, Sequence

from longdoc.data.examples import StructuredExample
from longdoc.data.prediction_scores import PredictionScores, is_fraction
from longdoc.serve.views import (
    BrowseParts, Column, ExampleBrowser, ExampleRow, ExampleView, Mark, PredictionFile, RunResult, TextBlock,
    fraction_cell, open_examples, table_of,
)
from longdoc.tasks.wikihop.metric import is_correct, read_predictions
from longdoc.tasks.wikihop.reader import read_examples


def _line(value) -> str:
    return value if isinstance(value, str) else repr(value)


def check_scores(record: Mapping) -> str | None:
    """What is wrong with one record of a WikiHop scores side file (None: nothing)."""
    candidates = record.get("candidates")
    if not isinstance(candidates, list) or not all(
            isinstance(c, dict) and isinstance(c.get("text"), str)
            and (c.get("probability") is None or is_fraction(c["probability"])) for c in candidates):
        return "'candidates' must be a list of {\"text\": candidate, \"probability\": a number in [0, 1] or null}"
    return None


def _probabilities(scores: PredictionScores, example_id: str) -> dict[str, float | None] | None:
    """{candidate: probability} of one example in one file's scores; None when it has none for it."""
    record = scores.records.get(example_id)
    return None if record is None else {c["text"]: c["probability"] for c in record["candidates"]}


def _scores_field(scores: PredictionScores, example_id: str, choice, gold: str) -> tuple[str, str]:
    """The ("probability", ...) line of one file: its choice's and the gold's, or why there are none."""
    probabilities = _probabilities(scores, example_id)
    if probabilities is None:
        return "probability", scores.none_for(example_id)
    choice_text = "no choice" if choice is None else f"{_line(choice)} {_percent(probabilities.get(choice))}"
    return "probability", f"{choice_text}; gold {gold} {_percent(probabilities.get(gold))}"


def _percent(probability: float | None) -> str:
    return "(dropped by the global budget)" if probability is None else f"{probability:.1%}"


def _row(example: StructuredExample, files: Sequence[PredictionFile]) -> tuple[ExampleRow, StructuredExample]:
    gold = {"id": example.id, "answer": example.labels["answer"]}  # what the metric reads of a gold example
    runs = []
    for file in files:
        judged = is_correct(gold, file.predictions)
        runs.append(RunResult(prediction=_line(file.predictions.get(example.id, "")), right=judged,
                              metrics={"accuracy": float(judged is True)}))
    row = ExampleRow(id=example.id, question=example.question, gold=gold["answer"],
                     # The query's first word is its relation (country, instance_of, ...).
                     facets={"relation": example.question.split(" ", 1)[0],
                             "candidates": str(len(example.candidates))},
                     runs=tuple(runs))
    return row, example


def _view(example: StructuredExample, files: Sequence[PredictionFile]) -> ExampleView:
    gold = example.labels["answer"]
    chosen = [file.predictions.get(example.id) for file in files]
    marks: list[list[Mark]] = [[] for _ in example.documents]
    for candidate in example.candidates:
        sides = [(None, "answer")] if candidate.text == gold else []
        sides += [(run, "answer") for run, choice in enumerate(chosen) if choice == candidate.text]
        for mention in candidate.mentions:
            for run, kind in sides or [(None, "candidate")]:
                marks[mention.document].append(Mark(mention.start, mention.end, kind, run, candidate.text))
    probabilities = [_probabilities(file.scores, example.id) for file in files]
    # Best first by the first file with scores for this example; else the candidate list's order.
    ranking = next((p for p in probabilities if p is not None), None)
    ordered = example.candidates if ranking is None else sorted(
        example.candidates, key=lambda c: 1.0 if ranking.get(c.text) is None else -ranking[c.text])
    columns = [Column("candidate", lambda c: c.text), Column("gold", lambda c: "gold" if c.text == gold else "")]
    for run, found in enumerate(probabilities):
        columns.append(Column(f"run {run + 1}", lambda c, run=run: "chosen" if chosen[run] == c.text else ""))
        if found is not None:  # a file without scores for it keeps the one column
            columns.append(Column(f"run {run + 1} probability", lambda c, found=found: fraction_cell(
                found.get(c.text)), bar=True))
    columns.append(Column("mentions", lambda c: str(len(c.mentions))))
    table = table_of("candidates" if ranking is None else "candidates, most probable first", ordered, columns)
    fields = [("query", example.question), ("answer", gold)]
    if "annotations" in example.labels:
        fields.append(("annotations", "; ".join(", ".join(map(str, a)) for a in example.labels["annotations"])))
    return ExampleView(
        id=example.id, fields=tuple(fields),
        run_fields=tuple((("answer", _line(choice) if choice is not None else ""),
                          _scores_field(file.scores, example.id, choice, gold))
                         for choice, file in zip(chosen, files)),
        tables=(table,),
        texts=tuple(TextBlock(f"support {d + 1}", document.text, tuple(marks[d]))
                    for d, document in enumerate(example.documents)))


PARTS = BrowseParts(right_means="the chosen candidate is the answer", metric_keys=("accuracy",),
                    read_predictions=read_predictions, row=_row, view=_view, check_scores=check_scores)


def open_browser(gold_path, pred_paths, **metric_options) -> ExampleBrowser:
    """The examples of a WikiHop gold file (read once, by the reader) against prediction files
    {id: answer} (and their scores side files)."""
    return open_examples(PARTS, read_examples(gold_path), pred_paths)
