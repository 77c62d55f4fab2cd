"""HotpotQA examples and predictions as `longdoc serve --task hotpotqa` shows them
(longdoc.serve.views).

Per example: the question, the gold and each prediction file's answer, the ten paragraphs with the
gold's and each file's supporting facts marked, and the official figures of the example (EM, F1,
precision and recall of the answer, the supporting facts and both jointly, from
`metric.example_scores`: their mean over the gold is what `longdoc evaluate` prints).
A prediction file holds answer text, not offsets: a predicted answer is marked where its text
occurs, by the reader's rule for gold answers (`reader.answer_spans`), so a wrong answer that
occurs nowhere is only shown in its field.
With a file's scores side file beside it (PRED.scores.jsonl: `longdoc predict` writes it,
longdoc.tasks.hotpotqa.decode says what it holds): its answer type probabilities, and the
sentences most probable as supporting facts (with the gold's and each file's) in a table, most
probable first; a file without one is said to have no scores.
"""

from typing import Mapping, Sequence

from longdoc.data.examples import StructuredExample
from longdoc.data.prediction_scores import PredictionScores, is_fraction
from longdoc.serve.views import (
    BrowseParts, Column, ExampleBrowser, ExampleRow, ExampleView, Mark, PredictionFile, RunResult, Table, TextBlock,
    fraction_cell, open_examples, table_of,
)
from longdoc.tasks.hotpotqa.metric import example_scores, read_prediction
from longdoc.tasks.hotpotqa.reader import answer_spans, read_examples

METRIC_KEYS = ("em", "f1", "sp_em", "sp_f1", "joint_em", "joint_f1", "prec", "recall", "sp_prec", "sp_recall",
               "joint_prec", "joint_recall")
YES_NO = ("yes", "no")
TOP_SENTENCES = 5  # the most probable sentences of each file with scores that the table lists


def check_scores(record: Mapping) -> str | None:
    """What is wrong with one record of a HotpotQA scores side file (None: nothing)."""
    types = record.get("answer_type")
    if not isinstance(types, dict) or set(types) != {"span", *YES_NO} or not all(map(is_fraction, types.values())):
        return "'answer_type' must be {\"span\": p, \"yes\": p, \"no\": p}, numbers in [0, 1]"
    if not is_fraction(record.get("sp_threshold")):
        return "'sp_threshold' must be a number in [0, 1]"
    sentences = record.get("sentences")
    if not isinstance(sentences, list) or not all(
            isinstance(item, list) and len(item) == 3 and isinstance(item[0], str) and isinstance(item[1], int)
            and is_fraction(item[2]) for item in sentences):
        return "'sentences' must be a list of [title, sentence index, probability in [0, 1]]"
    return None


def _sentence_table(gold_facts, run_facts, records) -> Table | None:
    """The sentences most probable as supporting facts by each file with scores, and the gold's and
    each file's facts, most probable first by the first file with scores; None when none has any."""
    scored = [None if record is None else {(title, index): p for title, index, p in record["sentences"]}
              for record in records]
    ranking = next((found for found in scored if found is not None), None)
    if ranking is None:
        return None
    listed = dict.fromkeys([*gold_facts, *(fact for facts in run_facts for fact in facts)])
    for found in scored:
        if found is not None:
            listed.update(dict.fromkeys(sorted(found, key=lambda fact: -found[fact])[:TOP_SENTENCES]))
    columns = [Column("paragraph", lambda fact: fact[0]), Column("sentence", lambda fact: str(fact[1])),
               Column("gold", lambda fact: "gold" if fact in gold_facts else "")]
    for run, (facts, found) in enumerate(zip(run_facts, scored)):
        columns.append(Column(f"run {run + 1}", lambda fact, facts=set(facts): "support" if fact in facts else ""))
        if found is not None:  # a file without scores for it keeps the one column
            columns.append(Column(f"run {run + 1} probability", lambda fact, found=found: fraction_cell(
                found.get(fact)), bar=True))
    return table_of("supporting sentences, most probable first",
                    sorted(listed, key=lambda fact: -ranking.get(fact, -1.0)), columns)


def _type_field(side_file: PredictionScores, example_id: str) -> tuple[str, str]:
    """The ("answer type", ...) line of one file: its type probabilities, or why it has none."""
    record = side_file.records.get(example_id)
    return "answer type", side_file.none_for(example_id) or " · ".join(
        f"{kind} {p:.1%}" for kind, p in record["answer_type"].items())


def _split_facts(example: StructuredExample, predicted) -> tuple[list[tuple[str, int]], list]:
    """(the predicted facts that name a sentence of the context, the other items): the metric scores
    both (the others as wrong facts), the view marks the first and lists the others."""
    sentences = {(title, index) for title, document in zip(_titles(example), example.documents)
                 for index in range(len(document.paragraphs[0].sentences))}
    placed, other = [], []
    for item in predicted if isinstance(predicted, list) else [predicted]:
        # The metric's equality: a sentence index 0.0 or true is 0 or 1 (metric._as_fact).
        named = isinstance(item, list) and len(item) == 2 and isinstance(item[1], (int, float))
        if named and (item[0], item[1]) in sentences:
            placed.append((item[0], int(item[1])))
        else:
            other.append(item)
    return placed, other


def _titles(example: StructuredExample) -> list[str]:
    return [document.text[:document.paragraphs[0].title.end] for document in example.documents]


def _paragraph_marks(example: StructuredExample, facts: list[tuple[str, int]], answer: str,
                     run: int | None) -> list[list[Mark]]:
    """Per paragraph, the marks of one side (gold or a prediction file): its supporting sentences and
    where its answer text occurs, in the paragraph's sentence text (the title line left out)."""
    titles = _titles(example)
    marks: list[list[Mark]] = [[] for _ in example.documents]
    for title, index in facts:
        for d, document in enumerate(example.documents):
            sentences = document.paragraphs[0].sentences
            if titles[d] == title and 0 <= index < len(sentences):
                offset = len(title) + 1
                sentence = sentences[index]
                marks[d].append(Mark(sentence.start - offset, sentence.end - offset, "support", run,
                                     f"sentence {index}"))
    if answer not in YES_NO:
        for span in answer_spans(example, answer, set(facts)):
            offset = len(titles[span.document]) + 1
            marks[span.document].append(Mark(span.start - offset, span.end - offset, "answer", run))
    return marks


def _describe_facts(facts) -> str:
    return "; ".join(f"{title} [{index}]" for title, index in facts)


def _row(example: StructuredExample, files: Sequence[PredictionFile]) -> tuple[ExampleRow, StructuredExample]:
    labels = example.labels
    # What the metric reads of a gold example.
    gold = {"_id": example.id, "answer": labels["answer"], "supporting_facts": labels["supporting_facts"]}
    runs = []
    for file in files:
        scores = example_scores(gold, file.predictions["answer"], file.predictions["sp"])
        figures = scores.figures()
        answer = file.predictions["answer"].get(example.id, "")
        runs.append(RunResult(prediction=answer if isinstance(answer, str) else repr(answer),
                              right=None if scores.answer is None else scores.answer.em == 1.0,
                              metrics={key: figures[key] for key in METRIC_KEYS}))
    row = ExampleRow(id=example.id, question=example.question, gold=labels["answer"],
                     facets={"type": str(labels["type"]), "level": str(labels["level"]),
                             "answer": "yes/no" if labels["answer"] in YES_NO else "span"},
                     runs=tuple(runs))
    return row, example


def _view(example: StructuredExample, files: Sequence[PredictionFile]) -> ExampleView:
    gold_facts = [(title, index) for title, index in example.labels["supporting_facts"]]
    sides = [_paragraph_marks(example, gold_facts, example.labels["answer"], None)]
    run_fields, run_facts = [], []
    records = [file.scores.records.get(example.id) for file in files]
    for run, (file, record) in enumerate(zip(files, records)):
        facts, other = _split_facts(example, file.predictions["sp"].get(example.id, []))
        run_facts.append(facts)
        answer = file.predictions["answer"].get(example.id, "")
        sides.append(_paragraph_marks(example, facts, answer if isinstance(answer, str) else "", run))
        fields = [("answer", answer if isinstance(answer, str) else repr(answer)),
                  _type_field(file.scores, example.id), ("supporting facts", _describe_facts(facts))]
        if record is not None:
            fields.append(("supporting-fact threshold", f"{record['sp_threshold']:g}"))
        if other:
            fields.append(("facts not in the context", "; ".join(map(repr, other))))
        run_fields.append(tuple(fields))
    texts = tuple(TextBlock(title, document.text[len(title) + 1:], tuple(mark for side in sides for mark in side[d]))
                  for d, (title, document) in enumerate(zip(_titles(example), example.documents)))
    fields = (("answer", example.labels["answer"]), ("supporting facts", _describe_facts(gold_facts)),
              ("type", str(example.labels["type"])), ("level", str(example.labels["level"])))
    table = _sentence_table(gold_facts, run_facts, records)
    return ExampleView(id=example.id, fields=fields, run_fields=tuple(run_fields),
                       tables=() if table is None else (table,), texts=texts)


PARTS = BrowseParts(right_means="the answer is an exact match (EM 1)", metric_keys=METRIC_KEYS,
                    read_predictions=read_prediction, row=_row, view=_view, check_scores=check_scores)


def open_browser(gold_path, pred_paths, **metric_options) -> ExampleBrowser:
    """The examples of a HotpotQA gold file (read once, by the reader) against prediction files
    {"answer": {id: text}, "sp": {id: facts}} (and their scores side files)."""
    return open_examples(PARTS, read_examples(gold_path), pred_paths)
