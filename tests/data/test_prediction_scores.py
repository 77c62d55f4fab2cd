"""The scores side file (longdoc.data.prediction_scores): written beside its prediction file and
tied to it by sha256, read back by example id; absent or stale scores are said to be so; a malformed
file is refused naming the file and line."""

import json

import pytest

from longdoc.data.prediction_scores import read_scores, scores_path, write_scores
from longdoc.errors import InputError


def _no_problem(record) -> None:
    return None


def _prediction(tmp_path, content: str = '{"q1": "a", "q2": "b"}'):
    path = tmp_path / "pred.json"
    path.write_text(content, encoding="utf-8")
    return path


def test_written_beside_the_prediction_file_and_read_back_by_id(tmp_path):
    prediction = _prediction(tmp_path)
    before = prediction.read_bytes()
    records = [{"id": "q1", "score": 0.25}, {"id": "q2", "score": 0.75}]
    assert write_scores(prediction, iter(records)) == scores_path(prediction) == tmp_path / "pred.json.scores.jsonl"
    assert prediction.read_bytes() == before  # the official file is left as it is
    header, *lines = [json.loads(line) for line in scores_path(prediction).read_text().splitlines()]
    assert header["scores_of"] == "pred.json" and len(header["sha256"]) == 64 and lines == records
    scores = read_scores(prediction, _no_problem)
    assert scores.absent == "" and scores.records == {"q1": records[0], "q2": records[1]}


def test_absent_and_stale_scores_are_said_to_be_so(tmp_path):
    prediction = _prediction(tmp_path)
    absent = read_scores(prediction, _no_problem)
    assert absent.records == {} and absent.absent.startswith("no pred.json.scores.jsonl beside pred.json")
    write_scores(prediction, [{"id": "q1"}])
    prediction.write_text('{"q1": "c", "q2": "b"}', encoding="utf-8")  # predicted again, by something else
    stale = read_scores(prediction, _no_problem)
    assert stale.records == {} and "written with another version of pred.json (sha256 differs)" in stale.absent


@pytest.mark.parametrize("lines, message", [
    (["{not json"], r"pred.json.scores.jsonl:1:2: not valid JSON"),
    (['{"id": "q1"}'], r"pred.json.scores.jsonl:1: the first line must be the header"),
    ([], r"pred.json.scores.jsonl: empty"),
    (["HEADER", '["q1", 0.5]'], r"pred.json.scores.jsonl:2: each line after the header must be an object with a "
                                r"string 'id'"),
    (["HEADER", '{"id": "q1"}', "", '{"id": "q1"}'], r"pred.json.scores.jsonl:4: example 'q1' is given twice"),
    (["HEADER", '{"id": "q2", "bad": true}'], r"pred.json.scores.jsonl:2: example 'q2': 'bad' is not allowed"),
])
def test_a_malformed_file_names_the_file_and_line(tmp_path, lines, message):
    prediction = _prediction(tmp_path)
    write_scores(prediction, [])
    header = scores_path(prediction).read_text().strip()
    scores_path(prediction).write_text("".join(line.replace("HEADER", header) + "\n" for line in lines))
    with pytest.raises(InputError, match=message):
        read_scores(prediction, lambda record: "'bad' is not allowed" if "bad" in record else None)
