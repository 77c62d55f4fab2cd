"""HotpotQA's official metric, pinned on hand-computed examples (each value derived in a comment)."""

import json
import warnings

import pytest

from longdoc.errors import InputError
from longdoc.evaluate.answers import MatchScores
from longdoc.tasks.hotpotqa import TASK
from longdoc.tasks.hotpotqa.metric import (
    OFFICIAL_KEYS, evaluate, evaluate_files, example_scores, joint_scores, supporting_fact_scores,
)
from tests.tasks.conftest import assert_reference_rows_fit

SAMPLE = "hotpotqa/hotpot_dev_distractor_v1.first53.json"


def test_supporting_facts_are_sets():
    # Predicted {(A,0), (B,1)} after dropping the repeat; gold {(A,0), (C,2)}: tp 1, fp 1, fn 1.
    # P = R = F1 = 0.5, EM 0.
    scores = supporting_fact_scores([["A", 0], ["A", 0], ["B", 1]], [["A", 0], ["C", 2]])
    assert scores == MatchScores(em=0.0, prec=0.5, recall=0.5, f1=0.5)
    # Order does not matter: the same set is an exact match.
    assert supporting_fact_scores([["C", 2], ["A", 0]], [["A", 0], ["C", 2]]).em == 1.0


def test_sentence_index_given_as_string_never_matches():
    # ("A", "0") is not ("A", 0): tp 1 (C, 2), fp 1, fn 1 -> 0.5 each, as in the official script.
    assert supporting_fact_scores([["A", "0"], ["C", 2]], [["A", 0], ["C", 2]]).f1 == 0.5


def test_python_equal_numbers_match_like_the_official_tuples():
    # The official script compares Python tuples: 0.0 == 0 and true == 1, so both facts match.
    assert supporting_fact_scores([["A", 0.0], ["C", True]], [["A", 0], ["C", 1]]).em == 1.0


@pytest.mark.parametrize("predicted, expected_prec", [
    # a bare number is one wrong fact (the official script crashes): tp 1, fp 1 -> P 0.5; fn 1 -> R 0.5
    ([5, ["A", 0]], 0.5),
    # a nested list is one wrong fact too (unhashable there, a crash): same counts
    ([["A", [0]], ["A", 0]], 0.5),
    # a string item becomes a tuple of characters, as in the official script: ("A", "0") wrong
    (["A0", ["A", 0]], 0.5),
])
def test_wrongly_typed_facts_are_scored_never_crash(predicted, expected_prec):
    scores = supporting_fact_scores(predicted, [["A", 0], ["C", 2]])
    assert (scores.prec, scores.recall) == (expected_prec, 0.5)


@pytest.mark.parametrize("predicted", [None, 3, "A0", {"A": 0}])
def test_facts_that_are_not_a_list_score_zero(predicted):
    assert supporting_fact_scores(predicted, [["A", 0]]) == MatchScores(em=0.0, prec=0.0, recall=0.0, f1=0.0)


def test_joint_scores_multiply_precision_and_recall():
    # Joint P = 0.5 * 0.5 = 0.25, joint R = 1 * 0.5 = 0.5, joint F1 = 2 * 0.25 * 0.5 / 0.75 = 1/3.
    answer = MatchScores(em=0.0, prec=0.5, recall=1.0, f1=2 / 3)
    support = MatchScores(em=0.0, prec=0.5, recall=0.5, f1=0.5)
    joint = joint_scores(answer, support)
    assert (joint.em, joint.prec, joint.recall) == (0.0, 0.25, 0.5)
    assert joint.f1 == pytest.approx(1 / 3)
    # Joint EM is the product of the two EMs.
    assert joint_scores(MatchScores(1.0, 1.0, 1.0, 1.0), MatchScores(1.0, 1.0, 1.0, 1.0)).em == 1.0


GOLD = [
    {"_id": "g1", "answer": "Paris", "supporting_facts": [["A", 0], ["B", 1]]},
    {"_id": "g2", "answer": "yes", "supporting_facts": [["C", 0]]},
    {"_id": "g3", "answer": "blue whale", "supporting_facts": [["D", 2], ["E", 0]]},
]


def test_macro_average_scores_missing_predictions_zero_and_warns():
    prediction = {
        "answer": {"g1": "Paris", "g2": "no", "not-in-gold": "x"},
        "sp": {"g1": [["A", 0]], "g3": [["D", 2], ["E", 0]]},
    }
    with pytest.warns(UserWarning) as caught:
        metrics = evaluate(GOLD, prediction)
    messages = " | ".join(str(w.message) for w in caught)
    assert "1 of 3 gold examples have no predicted answer" in messages
    assert "1 of 3 gold examples have no predicted supporting facts" in messages
    assert "1 predicted ids are not in the gold file" in messages
    # g1: answer exact (1, 1, 1, 1); facts {(A,0)} vs {(A,0),(B,1)}: P 1, R 0.5, F1 2/3, EM 0;
    #     joint P 1, R 0.5, F1 2/3, EM 0.
    # g2: "no" vs "yes": answer 0; facts missing: no support and no joint credit.
    # g3: answer missing: 0; facts exact: 1 each; no joint credit.
    # Every sum is divided by the 3 gold examples.
    expected = {
        "em": 1 / 3, "f1": 1 / 3, "prec": 1 / 3, "recall": 1 / 3,
        "sp_em": 1 / 3, "sp_f1": (2 / 3 + 1) / 3, "sp_prec": 2 / 3, "sp_recall": (0.5 + 1) / 3,
        "joint_em": 0.0, "joint_f1": (2 / 3) / 3, "joint_prec": 1 / 3, "joint_recall": 0.5 / 3,
        # ROUGE-L: "Paris" vs "Paris" 1, "no" vs "yes" 0, g3 missing 0.
        "rougeL_prec": 1 / 3, "rougeL_recall": 1 / 3, "rougeL_f1": 1 / 3,
    }
    assert metrics == pytest.approx(expected)
    assert list(metrics)[:12] == list(OFFICIAL_KEYS)


def test_answer_that_is_not_text_is_a_wrong_answer():
    prediction = {"answer": {"g1": 42, "g2": "yes", "g3": "blue whale"},
                  "sp": {example["_id"]: example["supporting_facts"] for example in GOLD}}
    with pytest.warns(UserWarning, match="1 predicted answers are not text"):
        metrics = evaluate(GOLD, prediction)
    # g1 scores 0 on the answer (and so on the joint figures), g2 and g3 are perfect: 2/3.
    assert metrics["em"] == pytest.approx(2 / 3)
    assert metrics["joint_f1"] == pytest.approx(2 / 3)
    assert metrics["sp_em"] == 1.0


def test_one_examples_figures_are_what_it_adds_to_the_totals():
    prediction = {"answer": {"g1": "Paris", "g2": 42}, "sp": {"g1": [["A", 0]], "g3": [["D", 2], ["E", 0]]}}
    figures = [example_scores(example, prediction["answer"], prediction["sp"]).figures() for example in GOLD]
    # g1 as in the macro-average test above; g2 a non-text answer (wrong) and no facts; g3 facts only.
    assert (figures[0]["em"], figures[0]["sp_f1"], figures[0]["joint_recall"]) == (1.0, pytest.approx(2 / 3), 0.5)
    assert figures[1]["em"] == figures[1]["sp_em"] == figures[1]["rougeL_f1"] == 0.0
    assert (figures[2]["em"], figures[2]["sp_em"], figures[2]["joint_em"]) == (0.0, 1.0, 0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        totals = evaluate(GOLD, prediction)
    assert totals == {key: sum(f[key] for f in figures) / len(GOLD) for key in totals}


def _write(path, value):
    path.write_text(json.dumps(value))
    return path


def test_evaluate_files_reports_malformed_json_with_file_and_line(tmp_path):
    gold = _write(tmp_path / "gold.json", GOLD)
    pred = tmp_path / "pred.json"
    pred.write_text('{"answer": {},\n "sp": {,}}')
    with pytest.raises(InputError, match=r"pred\.json:2:"):
        evaluate_files(gold, pred)


@pytest.mark.parametrize("prediction, message", [
    ({"answer": {"g1": "Paris"}}, "no 'sp' field"),
    ({"sp": {}}, "no 'answer' field"),
    ({"answer": ["Paris"], "sp": {}}, "'answer' field must be a JSON object"),
    (["Paris"], "one JSON object"),
])
def test_evaluate_files_refuses_a_prediction_without_its_fields(tmp_path, prediction, message):
    gold = _write(tmp_path / "gold.json", GOLD)
    with pytest.raises(InputError, match=message):
        evaluate_files(gold, _write(tmp_path / "pred.json", prediction))


def test_evaluate_files_refuses_gold_without_its_fields(tmp_path):
    gold = _write(tmp_path / "gold.json", [{"_id": "g1", "answer": "Paris"}])
    pred = _write(tmp_path / "pred.json", {"answer": {}, "sp": {}})
    with pytest.raises(InputError, match=r"gold\.json: example 'g1': field 'supporting_facts' is missing"):
        evaluate_files(gold, pred)


def test_gold_scored_against_itself_is_perfect(shared_data, tmp_path):
    gold_path = shared_data / SAMPLE
    gold = json.loads(gold_path.read_text())
    prediction = {"answer": {e["_id"]: e["answer"] for e in gold}, "sp": {e["_id"]: e["supporting_facts"] for e in gold}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is missing, so nothing to warn about
        metrics = evaluate_files(gold_path, _write(tmp_path / "pred.json", prediction))
    assert metrics == dict.fromkeys(metrics, 1.0)
    assert_reference_rows_fit(TASK, metrics)
