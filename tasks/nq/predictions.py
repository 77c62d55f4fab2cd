"""Reading a Natural Questions prediction file (the official nq_eval.py format).

One JSON object: {"predictions": [{"example_id", "long_answer": {start_byte, end_byte,
start_token, end_token}, "long_answer_score", "short_answers": [spans], "short_answers_score",
"yes_no_answer"}, ...]}.

Rules from the official reader (eval_utils.read_prediction_json):
- a missing `long_answer` is the null span, missing `short_answers` the empty list, a missing
  `yes_no_answer` "none";
- `yes_no_answer` is lowercased and must be yes, no or none; yes/no together with a non-null
  short span is an error;
- both score fields are required;
- a repeated example_id keeps its last prediction.
Values the official script scores although they are not the documented type are scored the same
way here: booleans and floats are numbers (True is 1, 3.0 equals 3), "Yes" is "yes". Values it
stops on with a Python exception (a string score, a null span) are an InputError naming the
prediction instead.
"""

import math
import os
import warnings
from dataclasses import dataclass
from typing import Any

from longdoc.errors import InputError
from longdoc.io import read_json
from longdoc.tasks.nq.spans import NULL_SPAN, AnswerLabel, is_null_span_list, parse_span, parse_yes_no

YES_NO_VALUES = ("yes", "no", "none")


@dataclass(frozen=True)
class Prediction:
    example_id: Any
    answer: AnswerLabel
    long_score: float
    short_score: float


def _score(record: dict, field: str, where: str) -> float:
    if field not in record:
        raise InputError(f"{where}: missing field {field!r} (the official metric needs both scores)")
    value = record[field]
    # The scores are sorted to sweep thresholds, and the best one is reported: any finite number
    # will do (booleans as 0 and 1, as in the official script). Strings or null do not sort with
    # numbers (the official script fails there with a TypeError), NaN has no place in an order,
    # and an infinite best threshold would not be valid JSON.
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{where}: field {field!r} must be a finite number, got {value!r}")
    return value


def _read_prediction(record: Any, where: str) -> Prediction:
    if not isinstance(record, dict):
        raise InputError(f"{where}: each prediction must be a JSON object")
    if "example_id" not in record:
        raise InputError(f"{where}: missing field 'example_id'")
    example_id = record["example_id"]
    if isinstance(example_id, (list, dict)):
        raise InputError(f"{where}: 'example_id' must be a number or a string")
    where = f"{where} (example_id {example_id!r})"
    long_span = NULL_SPAN
    if "long_answer" in record:
        long_span = parse_span(record["long_answer"], lambda: f"{where}: long_answer")
    short_records = record.get("short_answers", [])
    if not isinstance(short_records, list):
        raise InputError(f"{where}: 'short_answers' must be a list of spans, got {short_records!r}")
    short_spans = tuple(parse_span(s, lambda: f"{where}: short_answers") for s in short_records)
    yes_no = parse_yes_no(record.get("yes_no_answer", "NONE"), lambda: where)
    if yes_no not in YES_NO_VALUES:
        raise InputError(f"{where}: 'yes_no_answer' must be YES, NO or NONE, got {record['yes_no_answer']!r}")
    if yes_no != "none" and not is_null_span_list(short_spans):
        raise InputError(f"{where}: a yes/no answer and short answer spans cannot both be given")
    return Prediction(
        example_id=example_id,
        answer=AnswerLabel(long_span, short_spans, yes_no),
        long_score=_score(record, "long_answer_score", where),
        short_score=_score(record, "short_answers_score", where),
    )


def read_predictions(path: str | os.PathLike) -> dict[Any, Prediction]:
    """Predictions by example id, validated as the official reader does."""
    content = read_json(path)
    if not isinstance(content, dict) or not isinstance(content.get("predictions"), list):
        raise InputError(f'{path}: expected a JSON object {{"predictions": [...]}}')
    predictions: dict[Any, Prediction] = {}
    for index, record in enumerate(content["predictions"]):
        prediction = _read_prediction(record, f"{path}: predictions[{index}]")
        if prediction.example_id in predictions:
            warnings.warn(
                f"{path}: example_id {prediction.example_id!r} is predicted more than once; "
                "the last prediction is used"
            )
        predictions[prediction.example_id] = prediction
    return predictions
