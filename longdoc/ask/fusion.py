"""Fusing rankings and sizing the reading budget, without learned weights.

`interleave` is round-robin fusion: the rankings take places in turn, each giving its best item not
yet taken. Unlike reciprocal rank fusion (Cormack et al., SIGIR 2009), which sums 1 / (60 + rank)
and so can rank an item first in one list and thirtieth in the other below items that are tenth
in both, it guarantees what a reader with a fixed budget needs: with `n` rankings and `k` places,
every ranking's best `k // n` items are read. When BM25 finds the one passage that names a person
and a sentence embedding ranks it among forty near-identical facts, that passage is read.

`near_ties` counts how many items at the top of a ranking score about as well as its best: when
many do, the ranking cannot tell them apart, and reading more of them is the only way to find the
right one (`longdoc.ask.retrieve.reading_budget`).
"""

from typing import Hashable, Iterable, Sequence, TypeVar

Item = TypeVar("Item", bound=Hashable)
_EXHAUSTED = object()


def interleave(rankings: Sequence[Iterable[Item]], k: int, taken: Iterable[Item] = ()) -> list[Item]:
    """At most `k` items, not in `taken`, chosen by the rankings in turn (each its best item not yet
    chosen or taken; a ranking with none left drops out), in the order chosen."""
    chosen = dict.fromkeys(taken)
    skip = len(chosen)
    remaining = [iter(ranking) for ranking in rankings]
    while remaining and len(chosen) - skip < k:
        for ranking in list(remaining):
            item = next((item for item in ranking if item not in chosen), _EXHAUSTED)
            if item is _EXHAUSTED:
                remaining.remove(ranking)
            elif len(chosen) - skip < k:
                chosen[item] = None
    return list(chosen)[skip:]


def near_ties(scores: Sequence[float], tolerance: float) -> int:
    """How many of `scores` (best first) are within `tolerance` of the best, relative to it: all of
    them when the best is not positive (nothing to be relative to), 0 for none."""
    if not scores:
        return 0
    best = scores[0]
    if best <= 0:
        return len(scores)
    return sum(score >= (1 - tolerance) * best for score in scores)
