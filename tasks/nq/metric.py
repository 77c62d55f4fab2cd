"""The official Natural Questions metric, with ROUGE-L for short answers beside it.

Implements google-research-datasets/natural-questions nq_eval.py (and eval_utils.py) at commit
c2c9b2fd85b5b23ae5e313b0d1c2658d1c1cd387 (2019-08-28, the last change to either) rule by rule;
the function each rule comes from is named where it is applied. In short:
- votes: gold has a long (short) answer when at least `long_non_null_threshold`
  (`short_non_null_threshold`, both 2 by default) annotators gave one; a yes/no answer counts as
  a short answer;
- a long answer is correct when gold has one and the predicted span equals any annotator's
  non-null long span; a short answer is correct when gold has one and either the predicted yes/no
  equals some annotator's, or the predicted span set equals some annotator's span set
  (tasks/nq/spans.py has the span rules);
- every example is ranked by its score; each distinct score is a threshold that keeps the
  predictions scoring at least that much; precision, recall and F1 are computed at each, and the
  best-F1 threshold and the best recall at precision >= 0.5, 0.75, 0.9 are reported.

The ROUGE-L figures (longdoc.evaluate.rouge: rouge-score's rougeL F-measure, not part of the official output) give
partial credit where the official metric gives 0 or 1: the short-answer text is the predicted
span set's non-HTML document tokens (or "yes"/"no"), compared with each annotator's; the best
match is the example's credit. Precision, recall and F1 then follow the official counting of
predicted and gold answers, ignoring scores (like nq_eval's "metrics ignoring scores").
"""

import itertools
import os
import warnings
from dataclasses import dataclass
from typing import Any, Iterable

from longdoc.errors import InputError, OptionWarning
from longdoc.evaluate.ids import require_gold_ids
from longdoc.evaluate.rouge import rouge_l
from longdoc.tasks.nq.gold import Document, GoldExample, iter_gold
from longdoc.tasks.nq.predictions import Prediction, read_predictions
from longdoc.tasks.nq.spans import AnswerLabel, spans_equal, span_sets_equal

TARGET_PRECISIONS = (0.5, 0.75, 0.9)  # nq_eval.get_metrics_with_answer_stats


@dataclass(frozen=True)
class AnswerStat:
    """One example's judgement for long or short answers (nq_eval's 4-tuple)."""

    has_gold: bool
    has_pred: bool
    is_correct: bool
    score: float


@dataclass(frozen=True)
class RecallAtPrecision:
    target: float
    recall: float
    precision: float
    threshold: float | None  # None when no threshold reaches the target precision


@dataclass(frozen=True)
class ThresholdSweep:
    f1: float
    precision: float
    recall: float
    threshold: float
    recall_at_precision: tuple[RecallAtPrecision, ...]


@dataclass(frozen=True)
class ExampleJudgement:
    long: AnswerStat
    short: AnswerStat
    short_rouge_l: float  # best ROUGE-L F-measure against an annotator; 0 unless both sides answer


def gold_has_long_answer(annotations: tuple[AnswerLabel, ...], threshold: int) -> bool:
    # eval_utils.gold_has_long_answer: count the annotators with a non-null long span. An example
    # without annotations has no answer (the official code would fail on it).
    return bool(annotations) and sum(a.has_long_answer for a in annotations) >= threshold


def gold_has_short_answer(annotations: tuple[AnswerLabel, ...], threshold: int) -> bool:
    # eval_utils.gold_has_short_answer: a non-null span list or a yes/no answer is a vote.
    return bool(annotations) and sum(a.has_short_answer for a in annotations) >= threshold


def judge_long(annotations: tuple[AnswerLabel, ...], prediction: Prediction, threshold: int) -> AnswerStat:
    """nq_eval.score_long_answer."""
    has_gold = gold_has_long_answer(annotations, threshold)
    predicted = prediction.answer
    # Annotators who gave no long answer never match (a null span equals nothing), even when the
    # vote says there is an answer.
    is_correct = (
        has_gold
        and predicted.has_long_answer
        and any(spans_equal(a.long_span, predicted.long_span) for a in annotations)
    )
    return AnswerStat(has_gold, predicted.has_long_answer, is_correct, prediction.long_score)


def judge_short(annotations: tuple[AnswerLabel, ...], prediction: Prediction, threshold: int) -> AnswerStat:
    """nq_eval.score_short_answer."""
    has_gold = gold_has_short_answer(annotations, threshold)
    predicted = prediction.answer
    is_correct = False
    if has_gold and predicted.has_short_answer:
        if predicted.yes_no != "none":
            # A yes/no prediction is judged on yes/no alone, against any annotator.
            is_correct = any(a.yes_no == predicted.yes_no for a in annotations)
        else:
            is_correct = any(span_sets_equal(a.short_spans, predicted.short_spans) for a in annotations)
    return AnswerStat(has_gold, predicted.has_short_answer, is_correct, prediction.short_score)


def _divide(numerator: float, denominator: float) -> float:
    # nq_eval.safe_divide: 0 when nothing is counted.
    return numerator / denominator if denominator else 0.0


def _f1(precision: float, recall: float) -> float:
    return _divide(2 * precision * recall, precision + recall)


def sweep_thresholds(stats: Iterable[AnswerStat], targets: tuple[float, ...] = TARGET_PRECISIONS) -> ThresholdSweep:
    """nq_eval.compute_pr_curves: the best-F1 threshold and recall at target precisions.

    Examples are ranked by score, highest first; each distinct score is a threshold keeping every
    example that scores at least that much, so tied examples enter together. Every example
    counts toward the gold total whatever its score. Thresholds are visited from the highest
    down and a later one replaces the best only when strictly better, so among equal F1 (or
    equal recall) the highest threshold wins; with no positive F1 the threshold stays 0.
    """
    ranked = sorted(stats, key=lambda stat: stat.score, reverse=True)
    total_gold = sum(stat.has_gold for stat in ranked)
    best = ThresholdSweep(0.0, 0.0, 0.0, 0.0, ())
    at_precision = [RecallAtPrecision(target, 0.0, 0.0, None) for target in targets]
    correct = predicted = 0
    for threshold, group in itertools.groupby(ranked, key=lambda stat: stat.score):
        for stat in group:
            correct += stat.is_correct
            predicted += stat.has_pred
        precision, recall = _divide(correct, predicted), _divide(correct, total_gold)
        f1 = _f1(precision, recall)
        if f1 > best.f1:
            best = ThresholdSweep(f1, precision, recall, threshold, ())
        at_precision = [
            RecallAtPrecision(point.target, recall, precision, threshold)
            if precision >= point.target and recall > point.recall
            else point
            for point in at_precision
        ]
    return ThresholdSweep(best.f1, best.precision, best.recall, best.threshold, tuple(at_precision))


def official_metrics(sweep: ThresholdSweep, prefix: str) -> dict[str, float]:
    """The keys nq_eval.get_metrics_with_answer_stats prints for one answer kind ("long-", "short-")."""
    metrics = {
        "best-threshold-f1": sweep.f1,
        "best-threshold-precision": sweep.precision,
        "best-threshold-recall": sweep.recall,
        "best-threshold": sweep.threshold,
    }
    for point in sweep.recall_at_precision:
        # nq_eval formats the target with "{:.2}": 0.5 -> "0.5", 0.75 -> "0.75".
        metrics[f"recall-at-precision>={point.target:.2}"] = point.recall
        metrics[f"precision-at-precision>={point.target:.2}"] = point.precision
    return {prefix + key: float(value) for key, value in metrics.items()}


def short_answer_text(answer: AnswerLabel, document: Document | None) -> str:
    """Text for ROUGE-L: "yes"/"no" for a yes/no answer (judged first, as in score_short_answer),
    else the non-HTML tokens of the non-null spans, in the order given."""
    if answer.yes_no != "none":
        return answer.yes_no
    if document is None:
        return ""
    return " ".join(document.text(span) for span in answer.short_spans if not span.is_null)


def judge_example(
    gold: GoldExample, prediction: Prediction, long_threshold: int, short_threshold: int
) -> ExampleJudgement:
    """Both official judgements and the short-answer ROUGE-L credit of one example."""
    short = judge_short(gold.annotations, prediction, short_threshold)
    credit = 0.0
    if short.has_gold and short.has_pred:
        predicted_text = short_answer_text(prediction.answer, gold.document)
        # With a vote threshold of 0 gold "has" an answer that no annotator gave: no credit.
        credit = max(
            (
                rouge_l(predicted_text, short_answer_text(a, gold.document)).f1
                for a in gold.annotations
                if a.has_short_answer
            ),
            default=0.0,
        )
    return ExampleJudgement(judge_long(gold.annotations, prediction, long_threshold), short, credit)


def rouge_l_metrics(judgements: Iterable[ExampleJudgement]) -> dict[str, float]:
    """ROUGE-L credit counted like nq_eval.compute_f1 counts correct answers."""
    judgements = list(judgements)
    credit = sum(j.short_rouge_l for j in judgements)
    precision = _divide(credit, sum(j.short.has_pred for j in judgements))
    recall = _divide(credit, sum(j.short.has_gold for j in judgements))
    return {
        "short-answer-rouge-l-f1": _f1(precision, recall),
        "short-answer-rouge-l-precision": precision,
        "short-answer-rouge-l-recall": recall,
    }


def _check_threshold(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"{name} must be a whole number >= 0, got {value!r}")


def _ids_as_text_hint(gold_ids: set, predicted_ids: set) -> str:
    if {str(i) for i in gold_ids} == {str(i) for i in predicted_ids}:
        return "the ids agree as text: write example_id with the gold's type (NQ ids are integers)"
    return ""


def _byte_only_against_token_gold(gold: GoldExample, prediction: Prediction) -> bool:
    # Simplified gold has token offsets only, so a predicted span with byte offsets only can never
    # equal it: a common mistake worth a warning.
    simplified_gold = gold.document is not None and gold.document.byte_offsets is None
    predicted_spans = (prediction.answer.long_span, *prediction.answer.short_spans)
    return simplified_gold and any(s.has_bytes and not s.has_tokens for s in predicted_spans)


def evaluate_files(
    gold_path: str | os.PathLike,
    pred_path: str | os.PathLike,
    long_non_null_threshold: int = 2,
    short_non_null_threshold: int = 2,
    *,
    allow_missing: bool = False,
) -> dict[str, float]:
    """Score an NQ prediction file against gold (original or simplified, .jsonl or .jsonl.gz, or
    a glob of shards): the official nq_eval keys plus the short-answer ROUGE-L keys. A prediction
    file without exactly the gold's ids is refused, as nq_eval refuses it, even with `allow_missing`
    (accepted so that every task's metric takes it: longdoc.evaluate.ids)."""
    _check_threshold("long_non_null_threshold", long_non_null_threshold)
    _check_threshold("short_non_null_threshold", short_non_null_threshold)
    predictions = read_predictions(pred_path)
    # Gold is streamed and each example judged as it arrives, so the documents (needed for the
    # ROUGE-L text) are never all in memory at once.
    judgements: dict[Any, ExampleJudgement | None] = {}
    first_seen: dict[Any, str] = {}
    without_document = byte_only = 0
    most_annotations = 0
    for gold in iter_gold(gold_path):
        most_annotations = max(most_annotations, len(gold.annotations))
        if gold.example_id in first_seen:
            # The official reader keeps the last record of a repeated id (a dict update).
            warnings.warn(
                f"{gold.where}: example_id {gold.example_id!r} repeats {first_seen[gold.example_id]}; "
                "the later record is used"
            )
        first_seen.setdefault(gold.example_id, gold.where)
        prediction = predictions.get(gold.example_id)
        if prediction is None:
            judgements[gold.example_id] = None
            continue
        judgements[gold.example_id] = judge_example(gold, prediction, long_non_null_threshold, short_non_null_threshold)
        without_document += gold.document is None
        byte_only += _byte_only_against_token_gold(gold, prediction)
    if not judgements:
        raise InputError(f"{gold_path}: no gold examples")
    # nq_eval.score_answers refuses prediction sets that differ from the gold.
    gold_ids, predicted_ids = set(judgements), set(predictions)
    require_gold_ids(pred_path, gold_path, predicted_ids - gold_ids, gold_ids - predicted_ids, official="nq_eval",
                     hint=_ids_as_text_hint(gold_ids, predicted_ids))
    if most_annotations < max(long_non_null_threshold, short_non_null_threshold):
        # Training-set gold has one annotation per example; under the dev set's votes of 2 no
        # example has a gold answer, and every score is 0 whatever was predicted.
        warnings.warn(OptionWarning(
            "{gold_path}: no example has more than {most} annotation(s), fewer than the non-null thresholds "
            "({long} long, {short} short): no gold answer can count; for one-annotation (training-format) gold pass "
            "{long_non_null_threshold} 1 {short_non_null_threshold} 1", gold_path=gold_path, most=most_annotations,
            long=long_non_null_threshold, short=short_non_null_threshold))
    if without_document:
        warnings.warn(
            f"{without_document} gold example(s) have neither document_tokens nor document_text: "
            "their short-answer ROUGE-L credit is 0"
        )
    if byte_only:
        warnings.warn(
            f"{byte_only} prediction(s) give spans with byte offsets only, but their gold is in the "
            "simplified format (token offsets only): such spans never match; "
            "give start_token and end_token too"
        )
    scored = list(judgements.values())
    return {
        **official_metrics(sweep_thresholds(j.long for j in scored), "long-"),
        **official_metrics(sweep_thresholds(j.short for j in scored), "short-"),
        **rouge_l_metrics(scored),
    }
