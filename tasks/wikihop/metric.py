"""WikiHop (QAngaroo v1.1) accuracy, as the QAngaroo leaderboard reports it.

QAngaroo publishes no evaluation script: its leaderboard takes a prediction file {id: answer}
(one candidate string per question) and reports accuracy over the gold questions. A prediction
is correct when it equals the gold answer string exactly; gold answers and candidates are
lowercase already, so a prediction copied from the candidate list needs no normalisation. A
question with no prediction counts as wrong, a prediction that is not text is simply unequal
(wrong), and predicted ids absent from the gold are ignored. We warn with the counts. A file that
leaves questions out or names others is refused unless `allow_missing` is given
(longdoc.evaluate.ids: the one rule of every task).
"""

import warnings

from longdoc.data.records import read_json_list
from longdoc.errors import InputError
from longdoc.evaluate.ids import check_prediction_ids
from longdoc.io import read_json


def is_correct(example: dict, predictions: dict) -> bool | None:
    """Whether the prediction for one parsed gold example is its answer; None when it has none."""
    if example["id"] not in predictions:
        return None
    return predictions[example["id"]] == example["answer"]


def evaluate(gold_examples: list[dict], predictions: dict) -> dict[str, float]:
    """Accuracy of parsed predictions {id: answer} over parsed gold examples [{id, answer}]."""
    correct = missing = 0
    for example in gold_examples:
        judged = is_correct(example, predictions)
        missing += judged is None
        correct += judged is True
    total = len(gold_examples)
    extra = len(set(predictions) - {example["id"] for example in gold_examples})
    if missing:
        warnings.warn(f"{missing} of {total} gold questions have no prediction; counted as wrong")
    if extra:
        warnings.warn(f"{extra} predicted ids are not in the gold file; ignored")
    return {"accuracy": correct / total}


def read_gold(path) -> list[dict]:
    return read_json_list(path, "WikiHop gold", "id", {"answer": str})


def read_predictions(path) -> dict:
    predictions = read_json(path)
    if not isinstance(predictions, dict):
        raise InputError(f"{path}: a WikiHop prediction file is one JSON object {{id: answer}}")
    return predictions


def evaluate_files(gold_path, pred_path, *, allow_missing: bool = False) -> dict[str, float]:
    """Score a prediction file {id: answer} against the official gold file; one that leaves
    questions out or names others is refused unless `allow_missing` (then scored as the
    leaderboard scores it)."""
    gold, predictions = read_gold(gold_path), read_predictions(pred_path)
    gold_ids = {example["id"] for example in gold}
    check_prediction_ids(pred_path, gold_path, set(predictions) - gold_ids,
                         {"prediction": gold_ids - set(predictions)}, allow_missing=allow_missing)
    return evaluate(gold, predictions)
