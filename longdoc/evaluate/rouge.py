"""ROUGE-L (Lin, 2004: longest common subsequence of tokens) through Google's `rouge-score` package.

Reported beside the official figures of extractive tasks (HotpotQA answers, NQ short answers),
never instead of them. We use the package's default tokenizer and no stemmer, the settings most
published ROUGE-L figures use, so our numbers compare with theirs. That tokenizer keeps only
ASCII letters and digits: a text with none of them (say an answer in Cyrillic) has no tokens, and
the package scores it 0 even against itself.
"""

from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class RougeScore:
    precision: float
    recall: float
    f1: float


@lru_cache(maxsize=1)
def _scorer():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)


def rouge_l(prediction: str, reference: str) -> RougeScore:
    """ROUGE-L precision, recall and F-measure of `prediction` against `reference`."""
    score = _scorer().score(reference, prediction)["rougeL"]
    return RougeScore(precision=score.precision, recall=score.recall, f1=score.fmeasure)
