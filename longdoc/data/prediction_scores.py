"""The scores side file: what a task's decoder scored, written beside the official prediction file.

The official prediction file keeps the official format byte for byte (the official metrics read
it), and most of these formats have no room for the model's scores (WikiHop's {id: answer},
OpenKP's ranked keyphrases). So `predict` also writes them to PRED.scores.jsonl (`scores_path`),
JSON lines:

  line 1: {"scores_of": PRED's file name, "sha256": of PRED's bytes}
  then:   {"id": example id, ...the task's fields}, one per example, in the prediction file's order

The header ties the scores to the very prediction file they were written with: a prediction file
written again, or edited, no longer matches, and its stale scores are not shown. The prediction
browser (`longdoc serve --task`) reads the side file of each prediction file it is given
(`read_scores`); each task's decoder documents its fields.
"""

import hashlib
import json
import os
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import Callable, Iterable, Mapping

from longdoc.errors import InputError
from longdoc.io import atomic_write_text, hash_file, iter_jsonl

SUFFIX = ".scores.jsonl"


def scores_path(prediction_path: str | os.PathLike) -> Path:
    """Where the scores of the prediction file `prediction_path` are written: PRED.scores.jsonl."""
    path = Path(prediction_path)
    return path.with_name(path.name + SUFFIX)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    hash_file(digest, path)
    return digest.hexdigest()


def write_scores(prediction_path: str | os.PathLike, records: Iterable[Mapping]) -> Path:
    """Write the scores side file of the prediction file `prediction_path` (already written):
    the header, then `records` ({"id", ...} each); atomically. Returns its path."""
    prediction_path = Path(prediction_path)
    header = {"scores_of": prediction_path.name, "sha256": _sha256(prediction_path)}
    # allow_nan=False: NaN and Infinity are not JSON; a score that is not a number is a bug, not a line.
    lines = [json.dumps(header)] + [json.dumps(record, ensure_ascii=False, allow_nan=False) for record in records]
    path = scores_path(prediction_path)
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return path


@dataclass(frozen=True)
class PredictionScores:
    """The scores of one prediction file, by example id; none, and why, when it has none to show."""

    path: Path  # the side file
    records: Mapping[str, Mapping] = field(default_factory=dict)
    absent: str = ""  # why there are no scores ("" when there are)

    def none_for(self, example_id: str) -> str:
        """Why there are no scores for this example, in words ("" when there are)."""
        if self.absent:
            return f"no scores: {self.absent}"
        return "" if example_id in self.records else f"no scores for this example in {self.path.name}"


def is_number(value) -> bool:
    """A JSON number (not a boolean), for a task's record check."""
    return isinstance(value, Real) and not isinstance(value, bool)


def is_fraction(value) -> bool:
    """A JSON number in [0, 1] (a probability), for a task's record check."""
    return is_number(value) and 0 <= value <= 1


def read_scores(prediction_path: str | os.PathLike, check: Callable[[Mapping], str | None]) -> PredictionScores:
    """The scores side file of `prediction_path`, when there is one and it was written with this
    very prediction file. `check(record)` says what is wrong with one record's task fields (None:
    nothing); a malformed file is an InputError naming it and the line."""
    prediction_path = Path(prediction_path)
    path = scores_path(prediction_path)
    if not path.is_file():
        return PredictionScores(path, absent=f"no {path.name} beside {prediction_path.name} "
                                             "(`longdoc predict` writes it)")
    records: dict[str, Mapping] = {}
    header = None
    for line, record in iter_jsonl(path):
        if header is None:
            if not (isinstance(record, dict) and isinstance(record.get("sha256"), str)
                    and isinstance(record.get("scores_of"), str)):
                raise InputError(f"{path}:{line}: the first line must be the header "
                                 '{"scores_of": FILE NAME, "sha256": HEX}')
            header = record
            continue
        if not isinstance(record, dict) or not isinstance(record.get("id"), str):
            raise InputError(f"{path}:{line}: each line after the header must be an object with a string 'id'")
        if record["id"] in records:
            raise InputError(f"{path}:{line}: example {record['id']!r} is given twice")
        problem = check(record)
        if problem:
            raise InputError(f"{path}:{line}: example {record['id']!r}: {problem}")
        records[record["id"]] = record
    if header is None:
        raise InputError(f"{path}: empty; the first line must be the header "
                         '{"scores_of": FILE NAME, "sha256": HEX}')
    if header["sha256"] != _sha256(prediction_path):
        return PredictionScores(path, absent=f"{path.name} was written with another version of "
                                             f"{prediction_path.name} (sha256 differs)")
    return PredictionScores(path, records)
