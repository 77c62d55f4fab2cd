"""Scoring one answer text against a gold one, as extractive QA metrics do: SQuAD's normalisation
(lowercase, drop ASCII punctuation, drop the words a/an/the, collapse whitespace), then exact match
and bag-of-tokens precision, recall and F1, in the arithmetic of HotpotQA's official script
(hotpotqa/hotpot, hotpot_evaluate_v1.py, `normalize_answer` and `update_answer`), which a task's
metric and the built-in generator's chance level both use.

Answers that normalise to "yes", "no" or "noanswer" get no partial credit: when either side is one
of them and the two differ, all four figures are 0.
"""

import re
import string
from collections import Counter
from dataclasses import dataclass

# Answers that only an exact match can score (the official list).
_NO_PARTIAL_CREDIT = ("yes", "no", "noanswer")
_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


@dataclass(frozen=True)
class MatchScores:
    em: float
    prec: float
    recall: float
    f1: float


ZERO = MatchScores(em=0.0, prec=0.0, recall=0.0, f1=0.0)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation, in the official order: lowercase, punctuation, articles, whitespace."""
    text = text.lower()
    text = "".join(character for character in text if character not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def answer_scores(prediction: str, gold: str) -> MatchScores:
    """Answer EM, precision, recall and F1 of one prediction (official `update_answer`)."""
    normalized_prediction = normalize_answer(prediction)
    normalized_gold = normalize_answer(gold)
    em = float(normalized_prediction == normalized_gold)
    if normalized_prediction != normalized_gold and (
        normalized_prediction in _NO_PARTIAL_CREDIT or normalized_gold in _NO_PARTIAL_CREDIT
    ):
        return ZERO
    prediction_tokens = normalized_prediction.split()
    gold_tokens = normalized_gold.split()
    num_same = sum((Counter(prediction_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        # Official quirk: two answers that both normalise to "" match exactly (EM 1) but share no
        # token, so their F1, precision and recall are 0.
        return MatchScores(em=em, prec=0.0, recall=0.0, f1=0.0)
    prec = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(gold_tokens)
    f1 = (2 * prec * recall) / (prec + recall)
    return MatchScores(em=em, prec=prec, recall=recall, f1=f1)
