"""WikiHop accuracy, pinned on hand-computed examples."""

import json
import warnings

import pytest

from longdoc.errors import InputError
from longdoc.tasks.wikihop import TASK
from longdoc.tasks.wikihop.metric import evaluate, evaluate_files, is_correct
from tests.tasks.conftest import assert_reference_rows_fit

SAMPLE = "wikihop/wikihop_dev.first28.json"
GOLD = [
    {"id": "q1", "answer": "german empire"},
    {"id": "q2", "answer": "france"},
    {"id": "q3", "answer": "spain"},
    {"id": "q4", "answer": "italy"},
    {"id": "q5", "answer": "poland"},
]


def test_accuracy_counts_missing_and_mistyped_predictions_as_wrong():
    predictions = {
        "q1": "german empire",  # correct
        "q2": "France",         # exact match only: the case differs, wrong
        "q4": ["italy"],        # not text: unequal, wrong (never a crash)
        "q5": "poland",         # correct
        "q9": "portugal",       # not in the gold: ignored
    }                           # q3 missing: wrong
    with pytest.warns(UserWarning) as caught:
        metrics = evaluate(GOLD, predictions)
    # 2 correct out of the 5 gold questions.
    assert metrics == {"accuracy": 2 / 5}
    messages = " | ".join(str(w.message) for w in caught)
    assert "1 of 5 gold questions have no prediction" in messages
    assert "1 predicted ids are not in the gold file" in messages


def _write(path, value):
    path.write_text(json.dumps(value))
    return path


def test_one_question_is_right_wrong_or_unanswered():
    predictions = {GOLD[0]["id"]: GOLD[0]["answer"], GOLD[1]["id"]: ["not", "text"]}
    assert [is_correct(example, predictions) for example in GOLD[:3]] == [True, False, None]


def test_evaluate_files_errors(tmp_path):
    gold = _write(tmp_path / "gold.json", GOLD)
    with pytest.raises(InputError, match=r"one JSON object \{id: answer\}"):
        evaluate_files(gold, _write(tmp_path / "pred.json", [["q1", "germany"]]))
    bad = tmp_path / "bad.json"
    bad.write_text('{"q1": "x",\n"q2" "y"}')
    with pytest.raises(InputError, match=r"bad\.json:2:"):
        evaluate_files(gold, bad)
    with pytest.raises(InputError, match=r"gold2\.json: example 'q1': field 'answer' is missing"):
        evaluate_files(_write(tmp_path / "gold2.json", [{"id": "q1"}]), _write(tmp_path / "p.json", {}))
    with pytest.raises(InputError, match=r"gold3\.json: a WikiHop gold file is a JSON list of examples, got dict"):
        evaluate_files(_write(tmp_path / "gold3.json", {"id": "q1"}), _write(tmp_path / "p.json", {}))
    with pytest.raises(InputError, match=r"gold4\.json: the WikiHop gold file holds no examples"):
        evaluate_files(_write(tmp_path / "gold4.json", []), _write(tmp_path / "p.json", {}))
    # A HotpotQA prediction file is a JSON object too: none of its ids is a question.
    hotpot = _write(tmp_path / "hotpot_pred.json", {"answer": {"q1": "germany"}, "sp": {"q1": []}})
    with pytest.raises(InputError, match=r"hotpot_pred\.json does not predict the examples of .*gold\.json: "
                                         r"2 predicted id\(s\) match no gold id: 'answer', 'sp'; "
                                         r"5 gold id\(s\) have no prediction: 'q1', 'q2', 'q3', 'q4', 'q5'; "
                                         r"give allow_missing"):
        evaluate_files(gold, hotpot)
    # Allowed, the questions without a prediction count as wrong, as the leaderboard counts them.
    with pytest.warns(UserWarning, match="5 of 5 gold questions have no prediction"):
        assert evaluate_files(gold, hotpot, allow_missing=True) == {"accuracy": 0.0}


def test_gold_scored_against_itself_is_perfect(shared_data, tmp_path):
    gold_path = shared_data / SAMPLE
    predictions = {example["id"]: example["answer"] for example in json.loads(gold_path.read_text())}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metrics = evaluate_files(gold_path, _write(tmp_path / "pred.json", predictions))
    assert metrics == {TASK.headline_metric: 1.0}
    assert_reference_rows_fit(TASK, metrics)
