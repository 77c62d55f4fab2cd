"""The official Natural Questions metric (nq_eval.py rules), pinned on hand-computed cases.

Span notation in comments: (s, e) is token span [s, e); "null" is the null span.
"""

import gzip
import json

import pytest

from longdoc.errors import InputError
from longdoc.tasks.nq import TASK
from longdoc.tasks.nq.metric import (
    AnswerStat,
    evaluate_files,
    gold_has_long_answer,
    gold_has_short_answer,
    judge_long,
    judge_short,
    sweep_thresholds,
)
from longdoc.tasks.nq.predictions import Prediction
from longdoc.tasks.nq.spans import NULL_SPAN, AnswerLabel, Span, span_sets_equal, spans_equal
from tests.tasks.conftest import assert_reference_rows_fit

NULL = {"start_byte": -1, "end_byte": -1, "start_token": -1, "end_token": -1}


def tokens(start, end):
    return Span(start_token=start, end_token=end)


def annotator(long=NULL_SPAN, short=(), yes_no="none"):
    return AnswerLabel(long, tuple(short), yes_no)


def prediction(long=NULL_SPAN, short=(), yes_no="none", long_score=0.0, short_score=0.0):
    return Prediction(0, AnswerLabel(long, tuple(short), yes_no), long_score, short_score)


# --- votes (eval_utils.gold_has_long_answer / gold_has_short_answer) ---------------------------


def test_long_vote_counts_annotators_with_a_non_null_long_span():
    one_vote = (annotator(tokens(0, 10)),) + (annotator(),) * 4
    two_votes = (annotator(tokens(0, 10)), annotator(tokens(0, 9))) + (annotator(),) * 3
    assert gold_has_long_answer(one_vote, 1) and not gold_has_long_answer(one_vote, 2)
    assert gold_has_long_answer(two_votes, 2) and not gold_has_long_answer(two_votes, 3)
    # No annotations: no answer whatever the threshold (the official code would fail here).
    assert not gold_has_long_answer((), 0)


def test_short_vote_counts_spans_and_yes_no_alike():
    # One annotator with spans, one with YES, one with only null spans: 2 votes.
    annotations = (
        annotator(short=[tokens(1, 3)]),
        annotator(yes_no="yes"),
        annotator(short=[NULL_SPAN]),
    )
    assert gold_has_short_answer(annotations, 2) and not gold_has_short_answer(annotations, 3)


# --- long answers (nq_eval.score_long_answer) ----------------------------------------------------


def test_long_answer_matches_any_non_null_annotator():
    # Votes: (0,10) and (0,9) make 2, so gold has a long answer at threshold 2.
    annotations = (annotator(tokens(0, 10)), annotator(tokens(0, 9))) + (annotator(),) * 3
    assert judge_long(annotations, prediction(tokens(0, 10), long_score=2.5), 2) == AnswerStat(True, True, True, 2.5)
    assert judge_long(annotations, prediction(tokens(0, 9)), 2).is_correct
    assert judge_long(annotations, prediction(tokens(1, 10)), 2) == AnswerStat(True, True, False, 0.0)
    # A null prediction predicts nothing and is not correct.
    assert judge_long(annotations, prediction(), 2) == AnswerStat(True, False, False, 0.0)


def test_long_answer_below_the_vote_is_never_correct():
    # Only one annotator gave (0,10): at threshold 2 gold has no long answer, so an equal
    # prediction is a false positive; at threshold 1 it is correct.
    annotations = (annotator(tokens(0, 10)),) + (annotator(),) * 4
    assert judge_long(annotations, prediction(tokens(0, 10)), 2) == AnswerStat(False, True, False, 0.0)
    assert judge_long(annotations, prediction(tokens(0, 10)), 1) == AnswerStat(True, True, True, 0.0)


# --- span equality (eval_utils.nonnull_span_equal / span_set_equal) ------------------------------


def test_spans_equal_on_bytes_or_else_on_tokens():
    both = Span(100, 120, 5, 7)
    assert spans_equal(both, Span(100, 120, 6, 9))  # equal bytes suffice
    assert spans_equal(both, Span(101, 120, 5, 7))  # bytes differ but tokens agree: falls through
    assert spans_equal(both, tokens(5, 7))  # simplified gold: tokens only
    assert not spans_equal(Span(100, 120), tokens(5, 7))  # bytes only vs tokens only: nothing shared
    assert not spans_equal(both, Span(101, 120, 5, 8))


def test_short_spans_compare_as_sets():
    gold = (tokens(1, 3), tokens(5, 6))
    assert span_sets_equal(gold, (tokens(5, 6), tokens(1, 3)))  # order does not matter
    assert span_sets_equal(gold, (tokens(1, 3), tokens(5, 6), tokens(1, 3), NULL_SPAN))  # duplicates, nulls dropped
    assert not span_sets_equal(gold, (tokens(1, 3),))  # a subset is wrong
    assert not span_sets_equal(gold, (tokens(1, 3), tokens(5, 6), tokens(7, 8)))  # a superset too


# --- short answers and yes/no (nq_eval.score_short_answer) ---------------------------------------


def test_short_answer_span_set_must_equal_one_annotator():
    annotations = (annotator(short=[tokens(1, 3), tokens(5, 6)]),) * 2 + (annotator(),) * 3
    assert judge_short(annotations, prediction(short=[tokens(1, 3), tokens(5, 6)]), 2).is_correct
    # Partly right is wrong: (1,3) alone does not equal {(1,3), (5,6)}.
    assert judge_short(annotations, prediction(short=[tokens(1, 3)]), 2) == AnswerStat(True, True, False, 0.0)
    # Below the vote (threshold 3) the exact set is a false positive.
    assert judge_short(annotations, prediction(short=[tokens(1, 3), tokens(5, 6)]), 3) == AnswerStat(
        False, True, False, 0.0
    )


def test_yes_no_prediction_is_judged_on_yes_no_alone():
    # Votes: YES and a span set make 2.
    annotations = (annotator(yes_no="yes"), annotator(short=[tokens(1, 3)])) + (annotator(),) * 3
    assert judge_short(annotations, prediction(yes_no="yes"), 2) == AnswerStat(True, True, True, 0.0)
    assert not judge_short(annotations, prediction(yes_no="no"), 2).is_correct
    assert judge_short(annotations, prediction(short=[tokens(1, 3)]), 2).is_correct
    # Only span annotators: a YES matches nobody's yes/no.
    spans_only = (annotator(short=[tokens(1, 3)]),) * 2
    assert judge_short(spans_only, prediction(yes_no="yes"), 2) == AnswerStat(True, True, False, 0.0)


def test_null_short_prediction_predicts_nothing():
    annotations = (annotator(short=[tokens(1, 3)]),) * 2
    assert judge_short(annotations, prediction(short=[NULL_SPAN]), 2) == AnswerStat(True, False, False, 0.0)


# --- threshold sweep and R@P (nq_eval.compute_pr_curves) -----------------------------------------


def test_sweep_counts_tied_scores_together():
    # 4 gold answers (A, C, D, E). Thresholds, highest first (cumulative correct / predicted):
    #   3   : A          -> 1/1: P 1,   R 1/4, F1 0.4
    #   2   : + B, C     -> 2/3: P 2/3, R 1/2, F1 (2*2/3*1/2)/(2/3+1/2) = 4/7
    #   1   : + D        -> 2/4: P 1/2, R 1/2, F1 1/2
    #   0.5 : + E (null) -> 2/4: unchanged
    # Were B and C taken one at a time, C first would give P 1, R 1/2, F1 2/3 at a threshold
    # that does not exist; the tie makes them enter together, in either order.
    a = AnswerStat(True, True, True, 3)
    b = AnswerStat(False, True, False, 2)
    c = AnswerStat(True, True, True, 2)
    d = AnswerStat(True, True, False, 1)
    e = AnswerStat(True, False, False, 0.5)
    for stats in ([a, b, c, d, e], [e, d, c, b, a]):
        sweep = sweep_thresholds(stats)
        assert (sweep.f1, sweep.precision, sweep.recall, sweep.threshold) == pytest.approx((4 / 7, 2 / 3, 1 / 2, 2))
        # R@P: P >= 0.5 holds down to threshold 0.5, but recall stops growing at threshold 2
        # (1/2 is not > 1/2), so that point is kept. P >= 0.75 and >= 0.9: only threshold 3.
        points = [(p.target, p.recall, p.precision, p.threshold) for p in sweep.recall_at_precision]
        expected = [(0.5, 1 / 2, 2 / 3, 2), (0.75, 1 / 4, 1, 3), (0.9, 1 / 4, 1, 3)]
        assert len(points) == len(expected)
        for point, expected_point in zip(points, expected):
            assert point == pytest.approx(expected_point)


def test_sweep_keeps_the_highest_threshold_among_equal_f1():
    # A correct answer at score 2, then at score 1 a null prediction for a null gold: P and R do
    # not change (F1 1 at both), and the first threshold, 2, stays the best.
    sweep = sweep_thresholds([AnswerStat(True, True, True, 2), AnswerStat(False, False, False, 1)])
    assert (sweep.f1, sweep.threshold) == (1.0, 2)


def test_sweep_with_no_correct_answer_reports_zeros_and_threshold_zero():
    sweep = sweep_thresholds([AnswerStat(True, True, False, 5)])
    assert (sweep.f1, sweep.precision, sweep.recall, sweep.threshold) == (0.0, 0.0, 0.0, 0.0)
    assert [(p.recall, p.precision, p.threshold) for p in sweep.recall_at_precision] == [(0.0, 0.0, None)] * 3


def test_sweep_matches_the_official_unit_test_case():
    # nq_eval_test.testPrCurve: a false positive scored 10 above a correct answer scored 1.
    # Threshold 10: 0/1 -> P 0, R 0; threshold 1: 1/2 -> P 1/2, R 1 (F1 2/3, the best).
    sweep = sweep_thresholds([AnswerStat(True, True, True, 1.0), AnswerStat(False, True, False, 10.0)])
    assert (sweep.precision, sweep.recall, sweep.threshold) == (0.5, 1.0, 1.0)
    assert [p.recall for p in sweep.recall_at_precision] == [1.0, 0.0, 0.0]


# --- whole files: original format (bytes), simplified format (tokens) ----------------------------

# One original-format document: token k covers bytes [10k, 10k+8); tokens 0, 6, 7, 9 are HTML.
WORDS = ["<P>", "Tracy", "McConnell", "is", "the", "mother", "</P>", "<P>", "yes", "</P>"]
DOCUMENT_TOKENS = [
    {"token": w, "start_byte": 10 * k, "end_byte": 10 * k + 8, "html_token": w.startswith("<")}
    for k, w in enumerate(WORDS)
]


def original(start, end):
    """An original-format span over tokens [start, end): byte and token offsets."""
    return {"start_byte": 10 * start, "end_byte": 10 * (end - 1) + 8, "start_token": start, "end_token": end}


def simplified(start, end):
    return {"start_token": start, "end_token": end}


def annotation(long=None, short=(), yes_no="NONE"):
    return {"long_answer": long or NULL, "short_answers": list(short), "yes_no_answer": yes_no}


def predicted(example_id, long=None, short=(), yes_no="NONE", long_score=0.0, short_score=0.0):
    record = {"example_id": example_id, "short_answers": list(short), "yes_no_answer": yes_no,
              "long_answer_score": long_score, "short_answers_score": short_score}
    if long is not None:
        record["long_answer"] = long
    return record


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def write_predictions(path, records):
    path.write_text(json.dumps({"predictions": records}))
    return path


def original_gold():
    none = annotation()
    return [
        # 101: long (0,7) by 2 annotators, short {(1,3)} by 2 and {(2,3)} by 1.
        {"example_id": 101, "document_tokens": DOCUMENT_TOKENS, "annotations": [
            annotation(original(0, 7), [original(1, 3)]), annotation(original(0, 7), [original(1, 3)]),
            annotation(short=[original(2, 3)]), none, none]},
        # 102: long (7,10) and YES by 2 annotators.
        {"example_id": 102, "document_tokens": DOCUMENT_TOKENS, "annotations": [
            annotation(original(7, 10), yes_no="YES"), annotation(original(7, 10), yes_no="YES"), none, none, none]},
        # 103: a single annotator: long (0,7), short {(1,2)}.
        {"example_id": 103, "document_tokens": DOCUMENT_TOKENS, "annotations": [
            annotation(original(0, 7), [original(1, 2)]), none, none, none, none]},
        # 104: nobody answers.
        {"example_id": 104, "document_tokens": DOCUMENT_TOKENS, "annotations": [none] * 5},
        # 105: long (0,7) and short {(1,3)} by 2 annotators.
        {"example_id": 105, "document_tokens": DOCUMENT_TOKENS, "annotations": [
            annotation(original(0, 7), [original(1, 3)])] * 2 + [none] * 3},
    ]


def original_predictions():
    return [
        # long by bytes only, equal to the gold's bytes: correct. Short (0,3) = "<P> Tracy McConnell":
        # not the span (1,3), so wrong, but its text without HTML equals "Tracy McConnell".
        predicted(101, {"start_byte": 0, "end_byte": 68, "start_token": -1, "end_token": -1}, [original(0, 3)],
                  long_score=5, short_score=5),
        # long: bytes (71, 98) differ from gold (70, 98) but tokens (7,10) agree: correct. YES (any case): correct.
        predicted(102, {**original(7, 10), "start_byte": 71}, yes_no="yes", long_score=3, short_score=3),
        # equal to the only annotator: correct when one vote suffices.
        predicted(103, original(0, 7), [original(1, 2)], long_score=4, short_score=4),
        # answers where nobody did: false positives.
        predicted(104, original(3, 6), [original(3, 4)], long_score=1, short_score=1),
        # null prediction (no long_answer, no short spans).
        predicted(105, long_score=2, short_score=2),
    ]


@pytest.fixture
def original_files(tmp_path):
    return (write_jsonl(tmp_path / "gold.jsonl", original_gold()),
            write_predictions(tmp_path / "pred.json", original_predictions()))


def test_original_format_at_the_default_vote_of_two(original_files):
    # Long, threshold 2. Gold has a long answer in 101, 102, 105 (3). Ranked by score:
    #   5: 101 correct     -> 1/1: P 1,   R 1/3, F1 1/2
    #   4: 103 wrong       -> 1/2: P 1/2, R 1/3, F1 2/5
    #   3: 102 correct     -> 2/3: P 2/3, R 2/3, F1 2/3  <- best
    #   2: 105 null        -> 2/3: same F1, not better
    #   1: 104 wrong       -> 2/4: P 1/2, R 2/3, F1 4/7
    # R@P>=0.5: recall 2/3 at P 2/3; >=0.75 and >=0.9: recall 1/3 at P 1 (threshold 5).
    # Short, threshold 2. Gold has a short answer in 101, 102 (YES votes), 105 (3).
    #   5: 101 wrong 0/1; 4: 103 wrong 0/2; 3: 102 YES correct 1/3: P 1/3, R 1/3, F1 1/3 <- best;
    #   2: 105 null 1/3; 1: 104 wrong 1/4: P 1/4, R 1/3, F1 2/7. No point reaches P 0.5.
    # ROUGE-L credit: 101 "Tracy McConnell" vs "Tracy McConnell" = 1; 102 "yes" vs "yes" = 1;
    # 103 and 104 have no gold short answer, 105 no prediction: 0. Credit 2 over 4 predicted
    # (101-104) and 3 gold: P 1/2, R 2/3, F1 4/7.
    metrics = evaluate_files(*original_files)
    assert metrics == pytest.approx({
        "long-best-threshold-f1": 2 / 3, "long-best-threshold-precision": 2 / 3,
        "long-best-threshold-recall": 2 / 3, "long-best-threshold": 3.0,
        "long-recall-at-precision>=0.5": 2 / 3, "long-precision-at-precision>=0.5": 2 / 3,
        "long-recall-at-precision>=0.75": 1 / 3, "long-precision-at-precision>=0.75": 1.0,
        "long-recall-at-precision>=0.9": 1 / 3, "long-precision-at-precision>=0.9": 1.0,
        "short-best-threshold-f1": 1 / 3, "short-best-threshold-precision": 1 / 3,
        "short-best-threshold-recall": 1 / 3, "short-best-threshold": 3.0,
        "short-recall-at-precision>=0.5": 0.0, "short-precision-at-precision>=0.5": 0.0,
        "short-recall-at-precision>=0.75": 0.0, "short-precision-at-precision>=0.75": 0.0,
        "short-recall-at-precision>=0.9": 0.0, "short-precision-at-precision>=0.9": 0.0,
        "short-answer-rouge-l-f1": 4 / 7, "short-answer-rouge-l-precision": 1 / 2,
        "short-answer-rouge-l-recall": 2 / 3,
    })
    assert all(isinstance(value, float) for value in metrics.values())


def test_original_format_at_a_vote_of_one(original_files):
    # Long, threshold 1: 103 now has gold and is correct; gold in 101, 102, 103, 105 (4).
    #   5: 1/1 P 1 R 1/4; 4: 2/2 P 1 R 1/2; 3: 3/3 P 1 R 3/4 F1 6/7 <- best; 2: same; 1: 3/4 P 3/4 R 3/4.
    #   R@P at all three targets: recall 3/4 at P 1 (threshold 3).
    # Short, threshold 1: 103's {(1,2)} is correct; gold in 101, 102, 103, 105 (4).
    #   5: 0/1; 4: 1/2 P 1/2 R 1/4; 3: 2/3 P 2/3 R 1/2 F1 4/7 <- best; 2: same; 1: 2/4 P 1/2 R 1/2.
    #   R@P>=0.5: recall 1/2 at P 2/3; P never reaches 0.75.
    # ROUGE-L: 103 "Tracy" vs "Tracy" adds 1: credit 3 over 4 predicted and 4 gold: 3/4 each.
    metrics = evaluate_files(*original_files, long_non_null_threshold=1, short_non_null_threshold=1)

    def best(kind):
        return [metrics[f"{kind}-best-threshold{part}"] for part in ("-f1", "-precision", "-recall", "")]

    assert best("long") == pytest.approx([6 / 7, 1, 3 / 4, 3])
    assert [metrics[f"long-recall-at-precision>={t}"] for t in ("0.5", "0.75", "0.9")] == pytest.approx([3 / 4] * 3)
    assert best("short") == pytest.approx([4 / 7, 2 / 3, 1 / 2, 3])
    assert metrics["short-recall-at-precision>=0.5"] == pytest.approx(1 / 2)
    assert metrics["short-precision-at-precision>=0.5"] == pytest.approx(2 / 3)
    assert metrics["short-recall-at-precision>=0.75"] == 0.0
    assert metrics["short-answer-rouge-l-f1"] == pytest.approx(3 / 4)


def test_gzipped_gold_in_shards_named_by_a_glob(tmp_path, original_files):
    # The official --gold_path is a glob over nq-dev-0?.jsonl.gz shards; same figures as one file.
    gold = original_gold()
    for shard, records in enumerate((gold[:2], gold[2:])):
        with gzip.open(tmp_path / f"nq-dev-0{shard}.jsonl.gz", "wt") as handle:
            handle.writelines(json.dumps(r) + "\n" for r in records)
    assert evaluate_files(tmp_path / "nq-dev-0?.jsonl.gz", original_files[1]) == evaluate_files(*original_files)


def test_simplified_gold_compares_tokens_and_rouge_gives_partial_credit(tmp_path):
    gold = write_jsonl(tmp_path / "gold.jsonl", [{
        "example_id": 7, "document_text": " ".join(WORDS),
        "annotations": [annotation(simplified(0, 7), [simplified(1, 3)])],
    }])
    # Long by tokens (bytes given too, which simplified gold lacks): correct. Short {(1,2)} "Tracy"
    # against {(1,3)} "Tracy McConnell": officially wrong (F1 0), ROUGE-L LCS 1 of 1 and 2
    # tokens: P 1, R 1/2, F 2/3; one example predicted and gold, so ROUGE-L P = R = F1 = 2/3.
    pred = write_predictions(tmp_path / "pred.json", [
        predicted(7, original(0, 7), [original(1, 2)], long_score=1, short_score=1)])
    metrics = evaluate_files(gold, pred, 1, 1)
    assert metrics["long-best-threshold-f1"] == 1.0
    assert metrics["short-best-threshold-f1"] == 0.0
    assert metrics["short-answer-rouge-l-f1"] == pytest.approx(2 / 3)


def test_byte_only_prediction_against_simplified_gold_never_matches_and_warns(tmp_path):
    gold = write_jsonl(tmp_path / "gold.jsonl", [{
        "example_id": 7, "document_text": " ".join(WORDS), "annotations": [annotation(simplified(0, 7))]}])
    pred = write_predictions(tmp_path / "pred.json", [
        predicted(7, {"start_byte": 0, "end_byte": 68, "start_token": -1, "end_token": -1}, long_score=1)])
    with pytest.warns(UserWarning, match="byte offsets only"):
        assert evaluate_files(gold, pred, 1, 1)["long-best-threshold-f1"] == 0.0


def test_real_simplified_sample_scored_against_itself_is_perfect(shared_data, tmp_path):
    gold_path = shared_data / "natural_questions" / "simplified-nq-train.sample2.jsonl"
    records = [json.loads(line) for line in gold_path.read_text().splitlines() if line.strip()]
    # The prediction repeats each example's (single) annotation, tokens only.
    answers = [r["annotations"][0] for r in records]
    pred = write_predictions(tmp_path / "pred.json", [
        predicted(r["example_id"],
                  {**NULL, "start_token": a["long_answer"]["start_token"], "end_token": a["long_answer"]["end_token"]},
                  [{**NULL, **s} for s in a["short_answers"]], a["yes_no_answer"], long_score=1.0, short_score=1.0)
        for r, a in zip(records, answers)])
    metrics = evaluate_files(gold_path, pred, long_non_null_threshold=1, short_non_null_threshold=1)
    # Each example has one annotator, so one vote must suffice; with the default 2 nothing has gold.
    # Every figure is 1, the best thresholds included (they are the shared score, 1.0).
    assert len(metrics) == 23 and set(metrics.values()) == {1.0}
    with pytest.warns(UserWarning, match=r"no example has more than 1 annotation\(s\), fewer than the non-null "
                                         r"thresholds \(2 long, 2 short\).*long_non_null_threshold 1"):
        assert evaluate_files(gold_path, pred)[TASK.headline_metric] == 0.0


# --- values of unexpected types, scored as the official script scores them -----------------------


def test_booleans_floats_and_case_are_scored_like_the_official_script(tmp_path, original_files):
    # Python's json gives True for true and 3.0 for 3.0; the official script compares them as
    # numbers (True == 1, 3.0 == 3) and lowercases yes_no_answer, so the figures do not change.
    records = original_predictions()
    records[0]["long_answer_score"] = 5.0
    records[1]["long_answer"] = {k: float(v) for k, v in records[1]["long_answer"].items()}
    records[1]["yes_no_answer"] = "Yes"
    records[3]["long_answer_score"] = records[3]["short_answers_score"] = True  # 1
    pred = write_predictions(tmp_path / "typed.json", records)
    assert evaluate_files(original_files[0], pred) == evaluate_files(*original_files)


@pytest.mark.parametrize("field, value, message", [
    ("long_answer_score", "5", "'long_answer_score' must be a finite number"),
    ("short_answers_score", None, "'short_answers_score' must be a finite number"),
    ("long_answer", {**NULL, "start_token": "3", "end_token": 5}, "'start_token' must be a number"),
    ("long_answer", None, "a span must be a JSON object"),
    ("short_answers", None, "'short_answers' must be a list"),
    ("yes_no_answer", None, "'yes_no_answer' must be a string"),
    ("yes_no_answer", "maybe", "must be YES, NO or NONE"),
])
def test_values_the_official_script_cannot_score_are_clear_errors(tmp_path, original_files, field, value, message):
    records = original_predictions()
    records[2][field] = value
    with pytest.raises(InputError, match=message) as error:
        evaluate_files(original_files[0], write_predictions(tmp_path / "bad.json", records))
    assert "predictions[2] (example_id 103)" in str(error.value)


# --- bad input ------------------------------------------------------------------------------------


def test_malformed_prediction_json_names_file_and_line(tmp_path, original_files):
    pred = tmp_path / "pred.json"
    pred.write_text('{"predictions": [\n{"example_id": 101},\n{"example_id": 102,,}\n]}')
    with pytest.raises(InputError, match=rf"{pred}:3:"):
        evaluate_files(original_files[0], pred)


def test_malformed_gold_line_names_file_and_line(tmp_path, original_files):
    gold = tmp_path / "gold.jsonl"
    gold.write_text(json.dumps(original_gold()[0]) + "\n{not json\n")
    with pytest.raises(InputError, match=rf"{gold}:2:"):
        evaluate_files(gold, original_files[1])


def test_yes_no_with_short_spans_is_refused(tmp_path, original_files):
    records = original_predictions()
    records[0]["yes_no_answer"] = "YES"  # 101 also has short spans
    with pytest.raises(InputError, match="yes/no answer and short answer spans"):
        evaluate_files(original_files[0], write_predictions(tmp_path / "bad.json", records))


@pytest.mark.parametrize("field", ["long_answer_score", "short_answers_score"])
def test_missing_score_is_refused(tmp_path, original_files, field):
    records = original_predictions()
    del records[4][field]
    with pytest.raises(InputError, match=rf"predictions\[4\] \(example_id 105\): missing field '{field}'"):
        evaluate_files(original_files[0], write_predictions(tmp_path / "bad.json", records))


def test_different_id_sets_are_refused_naming_the_ids(tmp_path, original_files):
    records = original_predictions()[:4] + [predicted(999)]
    expected = r"1 predicted id\(s\) match no gold id: 999; 1 gold id\(s\) have no prediction: 105"
    with pytest.raises(InputError, match=expected):
        evaluate_files(original_files[0], write_predictions(tmp_path / "bad.json", records))
    with pytest.raises(InputError, match="nq_eval scores only a file with exactly the gold's ids"):
        evaluate_files(original_files[0], write_predictions(tmp_path / "bad.json", records), allow_missing=True)


def test_ids_written_as_strings_are_refused_with_a_hint(tmp_path, original_files):
    records = [{**r, "example_id": str(r["example_id"])} for r in original_predictions()]
    with pytest.raises(InputError, match="agree as text"):
        evaluate_files(original_files[0], write_predictions(tmp_path / "bad.json", records))


def test_inconsistent_null_span_is_refused(tmp_path, original_files):
    # eval_utils.Span: one end of a pair given and the other -1.
    records = original_predictions()
    records[0]["long_answer"] = {**NULL, "start_token": 3}
    with pytest.raises(InputError, match="inconsistent null span"):
        evaluate_files(original_files[0], write_predictions(tmp_path / "bad.json", records))


def test_repeated_prediction_keeps_the_last_with_a_warning(tmp_path, original_files):
    records = original_predictions()
    wrong_first = {**records[2], "long_answer": original(1, 2)}
    pred = write_predictions(tmp_path / "pred.json", [wrong_first] + records)
    with pytest.warns(UserWarning, match="example_id 103 is predicted more than once"):
        assert evaluate_files(original_files[0], pred) == evaluate_files(*original_files)


@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_vote_thresholds_must_be_whole_numbers(original_files, value):
    with pytest.raises(InputError, match="long_non_null_threshold"):
        evaluate_files(*original_files, long_non_null_threshold=value)


def test_empty_gold_is_refused(tmp_path, original_files):
    with pytest.raises(InputError, match="no gold examples"):
        evaluate_files(write_jsonl(tmp_path / "gold.jsonl", []), write_predictions(tmp_path / "pred.json", []))


def test_reference_rows_name_keys_the_metric_reports(original_files):
    assert_reference_rows_fit(TASK, evaluate_files(*original_files))
