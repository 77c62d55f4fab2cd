"""OpenKP's official metric, pinned on hand-computed examples and the repository's example pair."""

import json
import warnings

import pytest

from longdoc.errors import InputError
from longdoc.tasks.openkp import TASK
from longdoc.tasks.openkp.metric import (
    ScoresAtK, document_scores, evaluate_files, normalize_keyphrase,
    prepare_keyphrases,
)
from tests.tasks.conftest import assert_reference_rows_fit


def test_normalize_keyphrase_lowercases_and_joins_tokens():
    assert normalize_keyphrase(["Doctor", "APPOINTMENT"]) == "doctor appointment"
    # Trailing whitespace is stripped, punctuation and articles are kept (no SQuAD normalisation).
    assert normalize_keyphrase(["The", "web", ""]) == "the web"
    assert normalize_keyphrase(["C++"]) == "c++"


def test_prepare_drops_empty_phrases_and_deduplicates_in_order():
    phrases = [[], ["", "web"], ["Web"], ["Java", "Project"], ["web"], ["web", ""]]
    # [] and ["", "web"] are empty (official test: no token or an empty first token);
    # "web", "java project", then "web" twice more after normalising: kept once, first position.
    assert prepare_keyphrases(phrases) == ["web", "java project"]


def test_precision_at_k_divides_by_k():
    # 2 candidates, 2 references, the first candidate right.
    scores = document_scores(["a", "b"], ["a", "c"])
    # @1: tp 1: P 1/1, R 1/2, F1 2*(1*0.5)/1.5 = 2/3
    assert scores[1] == ScoresAtK(precision=1.0, recall=0.5, f1=pytest.approx(2 / 3))
    # @3: still tp 1, but P = 1/3 (k, not the 2 candidates), R 1/2, F1 2*(1/6)/(5/6) = 0.4
    assert scores[3] == ScoresAtK(precision=pytest.approx(1 / 3), recall=0.5, f1=pytest.approx(0.4))
    # @5: P 1/5, R 1/2, F1 2*(0.1)/0.7 = 2/7
    assert scores[5] == ScoresAtK(precision=0.2, recall=0.5, f1=pytest.approx(2 / 7))


def test_deduplication_changes_what_the_top_k_holds():
    # "a" twice: after de-duplication the top 2 are "a", "c", both right.
    candidates = prepare_keyphrases([["a"], ["A"], ["c"]])
    scores = document_scores(candidates, prepare_keyphrases([["a"], ["c"]]))
    assert (scores[1].precision, scores[3].precision, scores[3].recall) == (1.0, pytest.approx(2 / 3), 1.0)


def test_no_match_scores_zero_f1():
    assert document_scores(["x"], ["a"])[1] == ScoresAtK(precision=0.0, recall=0.0, f1=0.0)


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def test_macro_average_over_documents(tmp_path):
    gold = _write_jsonl(tmp_path / "gold.jsonl", [
        {"url": "u1", "KeyPhrases": [["a"], ["c"]]},
        {"url": "u2", "KeyPhrases": [["x"]]},
    ])
    pred = _write_jsonl(tmp_path / "pred.jsonl", [
        {"url": "u2", "KeyPhrases": [["y"], ["X"]]},  # order of lines does not matter
        {"url": "u1", "KeyPhrases": [["a"], ["b"]]},
    ])
    metrics = evaluate_files(gold, pred)
    # u1 is test_precision_at_k_divides_by_k: @1 (1, 1/2, 2/3), @3 (1/3, 1/2, 0.4), @5 (1/5, 1/2, 2/7).
    # u2: "x" is found second. @1 (0, 0, 0); @3 P 1/3, R 1, F1 2*(1/3)/(4/3) = 0.5; @5 P 1/5, R 1, F1 (2/5)/(6/5) = 1/3.
    expected = {
        "F1@1": (2 / 3 + 0) / 2, "P@1": (1 + 0) / 2, "R@1": (0.5 + 0) / 2,
        "F1@3": (0.4 + 0.5) / 2, "P@3": (1 / 3 + 1 / 3) / 2, "R@3": (0.5 + 1) / 2,
        "F1@5": (2 / 7 + 1 / 3) / 2, "P@5": (0.2 + 0.2) / 2, "R@5": (0.5 + 1) / 2,
    }
    assert metrics == pytest.approx(expected)
    assert list(metrics) == list(expected)


def test_readme_example_pair(shared_data):
    # The OpenKP README's expected output for eval_data/candidate.json against reference.json.
    metrics = evaluate_files(shared_data / "openkp/eval_reference_example.jsonl",
                             shared_data / "openkp/eval_candidate_example.jsonl")
    assert metrics["F1@1"] == 0.0
    assert metrics["P@3"] == metrics["R@3"] == metrics["F1@3"] == pytest.approx(2 / 3)
    assert (metrics["P@5"], metrics["R@5"], metrics["F1@5"]) == (pytest.approx(0.4), pytest.approx(2 / 3), pytest.approx(0.5))


@pytest.mark.parametrize("sample, n", [("openkp/eval_reference_example.jsonl", 3), ("openkp/openkp_readme_example.jsonl", 2)])
def test_gold_scored_against_itself_reaches_the_ceiling(shared_data, sample, n):
    # With n distinct non-empty gold phrases (the README document's third phrase [] is dropped),
    # a perfect prediction has tp = min(k, n): P@k = min(k, n) / k (P@k divides by k, so 1 is out of
    # reach when n < k) and R@k = min(k, n) / n.
    path = shared_data / sample
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metrics = evaluate_files(path, path)
    for k in (1, 3, 5):
        assert metrics[f"P@{k}"] == pytest.approx(min(k, n) / k)
        assert metrics[f"R@{k}"] == pytest.approx(min(k, n) / n)
    assert_reference_rows_fit(TASK, metrics)


def test_keyphrases_given_as_strings_are_refused(tmp_path):
    gold = _write_jsonl(tmp_path / "gold.jsonl", [{"url": "u1", "KeyPhrases": [["Web", "Application"]]}])
    pred = _write_jsonl(tmp_path / "pred.jsonl", [{"url": "u1", "KeyPhrases": ["Web Application"]}])
    with pytest.raises(InputError, match=r"pred\.jsonl:1: keyphrase 0 is a string .*\['Web', 'Application'\]"):
        evaluate_files(gold, pred)


@pytest.mark.parametrize("record, message", [
    ({"url": "u1"}, r":1: missing 'KeyPhrases'"),
    ({"url": "u1", "KeyPhrases": "Web Application"}, r":1: 'KeyPhrases' must be a list of token lists"),
    ({"url": "u1", "KeyPhrases": [["Web", 2]]}, r":1: keyphrase 0 must be a list of text tokens"),
    ({"KeyPhrases": [["Web"]]}, r":1: missing or non-text 'url'"),
])
def test_malformed_records_are_refused(tmp_path, record, message):
    gold = _write_jsonl(tmp_path / "gold.jsonl", [{"url": "u1", "KeyPhrases": [["Web"]]}])
    with pytest.raises(InputError, match=message):
        evaluate_files(gold, _write_jsonl(tmp_path / "pred.jsonl", [record]))


def test_malformed_json_names_file_and_line(tmp_path):
    gold = _write_jsonl(tmp_path / "gold.jsonl", [{"url": "u1", "KeyPhrases": [["Web"]]}])
    pred = tmp_path / "pred.jsonl"
    pred.write_text('\n{"url": "u1", "KeyPhrases": [["Web"]]\n')
    with pytest.raises(InputError, match=r"pred\.jsonl:2:"):
        evaluate_files(gold, pred)


def test_url_sets_must_match_and_are_named(tmp_path):
    gold = _write_jsonl(tmp_path / "gold.jsonl", [{"url": "u1", "KeyPhrases": [["a"]]}, {"url": "u2", "KeyPhrases": [["b"]]}])
    pred = _write_jsonl(tmp_path / "pred.jsonl", [{"url": "u1", "KeyPhrases": [["a"]]}, {"url": "u3", "KeyPhrases": [["b"]]}])
    expected = r"1 predicted id\(s\) match no gold id: 'u3'; 1 gold id\(s\) have no prediction: 'u2'"
    with pytest.raises(InputError, match=expected):
        evaluate_files(gold, pred)
    with pytest.raises(InputError, match="the official script scores only a file with exactly the gold's ids"):
        evaluate_files(gold, pred, allow_missing=True)


def test_gold_without_a_non_empty_phrase_is_refused(tmp_path):
    gold = _write_jsonl(tmp_path / "gold.jsonl", [{"url": "u1", "KeyPhrases": [[], [""]]}])
    pred = _write_jsonl(tmp_path / "pred.jsonl", [{"url": "u1", "KeyPhrases": [["a"]]}])
    with pytest.raises(InputError, match=r"gold line 1 \(u1\) has no non-empty keyphrase"):
        evaluate_files(gold, pred)


def test_repeated_url_keeps_its_last_line(tmp_path):
    gold = _write_jsonl(tmp_path / "gold.jsonl", [{"url": "u1", "KeyPhrases": [["a"]]}])
    pred = _write_jsonl(tmp_path / "pred.jsonl", [{"url": "u1", "KeyPhrases": [["a"]]}, {"url": "u1", "KeyPhrases": [["z"]]}])
    with pytest.warns(UserWarning, match="gives 1 urls more than once"):
        metrics = evaluate_files(gold, pred)
    assert metrics["P@1"] == 0.0  # the second line ("z") is the one scored
