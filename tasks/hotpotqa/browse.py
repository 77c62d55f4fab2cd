"""HotpotQA examples and predictions as `longdoc serve --task hotpotqa` shows them
(longdoc.serve.views).

Per example: the question, the gold and each prediction file's answer, the ten paragraphs with the
gold's and each file's supporting facts marked, and the official figures of the example (EM, F1,
precision and recall of the answer, the supporting facts and both jointly, from
`metric.example_scores`: their mean over the gold is what `longdoc evaluate` prints).
A prediction file holds answer text, not offsets: a predicted answer is marked where its text
occurs, by the reader's rule for gold answers (`reader.answer_spans`), so a wrong answer that
occurs nowhere is only shown in its field.
"""

from longdoc.data.examples import StructuredExample
from longdoc.serve.views import ExampleBrowser, ExampleRow, ExampleView, Mark, RunResult, TextBlock
from longdoc.tasks.hotpotqa.metric import example_scores, read_gold, read_prediction
from longdoc.tasks.hotpotqa.reader import answer_spans, read_examples

METRIC_KEYS = ("em", "f1", "sp_em", "sp_f1", "joint_em", "joint_f1", "prec", "recall", "sp_prec", "sp_recall",
               "joint_prec", "joint_recall")
YES_NO = ("yes", "no")


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


def open_browser(gold_path, pred_paths, **metric_options) -> ExampleBrowser:
    """The examples of a HotpotQA gold file against prediction files {"answer": {id: text}, "sp": {id: facts}}."""
    gold = read_gold(gold_path)
    predictions = [read_prediction(path) for path in pred_paths]
    examples = {example.id: example for example in read_examples(gold_path)}
    rows = []
    for record in gold:
        runs = []
        for prediction in predictions:
            scores = example_scores(record, prediction["answer"], prediction["sp"])
            figures = scores.figures()
            answer = prediction["answer"].get(record["_id"], "")
            runs.append(RunResult(prediction=answer if isinstance(answer, str) else repr(answer),
                                  right=None if scores.answer is None else scores.answer.em == 1.0,
                                  metrics={key: figures[key] for key in METRIC_KEYS}))
        rows.append(ExampleRow(
            id=record["_id"], question=record["question"], gold=record["answer"],
            facets={"type": str(record.get("type")), "level": str(record.get("level")),
                    "answer": "yes/no" if record["answer"] in YES_NO else "span"},
            runs=tuple(runs)))

    def view(example_id: str) -> ExampleView:
        example = examples[example_id]
        gold_facts = [(title, index) for title, index in example.labels["supporting_facts"]]
        sides = [_paragraph_marks(example, gold_facts, example.labels["answer"], None)]
        run_fields = []
        for run, prediction in enumerate(predictions):
            facts, other = _split_facts(example, prediction["sp"].get(example_id, []))
            answer = prediction["answer"].get(example_id, "")
            sides.append(_paragraph_marks(example, facts, answer if isinstance(answer, str) else "", run))
            fields = [("answer", answer if isinstance(answer, str) else repr(answer)),
                      ("supporting facts", _describe_facts(facts))]
            if other:
                fields.append(("facts not in the context", "; ".join(map(repr, other))))
            run_fields.append(tuple(fields))
        texts = tuple(TextBlock(title, document.text[len(title) + 1:], tuple(mark for side in sides for mark in side[d]))
                      for d, (title, document) in enumerate(zip(_titles(example), example.documents)))
        fields = (("answer", example.labels["answer"]), ("supporting facts", _describe_facts(gold_facts)),
                  ("type", str(example.labels["type"])), ("level", str(example.labels["level"])))
        return ExampleView(id=example_id, fields=fields, run_fields=tuple(run_fields), tables=(), texts=texts)

    return ExampleBrowser(right_means="the answer is an exact match (EM 1)", metric_keys=METRIC_KEYS,
                          totals_are_means=True, rows=tuple(rows), view=view)
