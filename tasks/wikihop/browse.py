"""WikiHop examples and predictions as `longdoc serve --task wikihop` shows them (longdoc.serve.views).

Per example: the query, the candidates (the gold answer and each prediction file's choice among
them), the supporting documents with the mentions of the gold answer and of each file's choice
marked (the reader's mention rule, `reader.find_mentions`), other candidates' mentions marked
apart, and the example's accuracy (`metric.is_correct`; the mean over the gold is `longdoc
evaluate`'s accuracy). The official prediction file {id: answer} holds the chosen candidate only,
so no candidate scores are shown.
"""

from longdoc.serve.views import ExampleBrowser, ExampleRow, ExampleView, Mark, RunResult, Table, TextBlock
from longdoc.tasks.wikihop.metric import is_correct, read_gold, read_predictions
from longdoc.tasks.wikihop.reader import read_examples


def _line(value) -> str:
    return value if isinstance(value, str) else repr(value)


def open_browser(gold_path, pred_paths, **metric_options) -> ExampleBrowser:
    """The examples of a WikiHop gold file against prediction files {id: answer}."""
    gold = read_gold(gold_path)
    predictions = [read_predictions(path) for path in pred_paths]
    examples = {example.id: example for example in read_examples(gold_path)}
    rows = []
    for record in gold:
        runs = []
        for predicted in predictions:
            judged = is_correct(record, predicted)
            runs.append(RunResult(prediction=_line(predicted.get(record["id"], "")), right=judged,
                                  metrics={"accuracy": float(judged is True)}))
        rows.append(ExampleRow(id=record["id"], question=record["query"], gold=record["answer"],
                               # The query's first word is its relation (country, instance_of, ...).
                               facets={"relation": record["query"].split(" ", 1)[0],
                                       "candidates": str(len(record["candidates"]))},
                               runs=tuple(runs)))

    def view(example_id: str) -> ExampleView:
        example = examples[example_id]
        gold = example.labels["answer"]
        chosen = [predicted.get(example_id) for predicted in predictions]
        marks: list[list[Mark]] = [[] for _ in example.documents]
        for candidate in example.candidates:
            sides = [(None, "answer")] if candidate.text == gold else []
            sides += [(run, "answer") for run, choice in enumerate(chosen) if choice == candidate.text]
            for mention in candidate.mentions:
                for run, kind in sides or [(None, "candidate")]:
                    marks[mention.document].append(Mark(mention.start, mention.end, kind, run, candidate.text))
        table = Table(
            title="candidates",
            columns=("candidate", "gold", *(f"run {run + 1}" for run in range(len(predictions))), "mentions"),
            rows=tuple((candidate.text, "gold" if candidate.text == gold else "",
                        *("chosen" if choice == candidate.text else "" for choice in chosen),
                        str(len(candidate.mentions))) for candidate in example.candidates))
        fields = [("query", example.question), ("answer", gold)]
        if "annotations" in example.labels:
            fields.append(("annotations", "; ".join(", ".join(map(str, a)) for a in example.labels["annotations"])))
        return ExampleView(
            id=example_id, fields=tuple(fields),
            run_fields=tuple((("answer", _line(choice) if choice is not None else ""),) for choice in chosen),
            tables=(table,),
            texts=tuple(TextBlock(f"support {d + 1}", document.text, tuple(marks[d]))
                        for d, document in enumerate(example.documents)))

    return ExampleBrowser(right_means="the chosen candidate is the answer", metric_keys=("accuracy",),
                          totals_are_means=True, rows=tuple(rows), view=view)
