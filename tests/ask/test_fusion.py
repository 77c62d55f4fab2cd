"""Round-robin fusion, near-ties and the reading budget, on hand-made rankings."""

import pytest

from longdoc.ask.fusion import interleave, near_ties
from longdoc.ask.index import Hit
from longdoc.ask.retrieve import RetrievalOptions, reading_budget


def test_rankings_take_places_in_turn_each_giving_its_best_item_not_yet_chosen():
    lexical, dense = ["a", "b", "c"], ["x", "a", "y"]
    assert interleave([lexical, dense], 4) == ["a", "x", "b", "y"]
    assert interleave([dense, lexical], 4) == ["x", "a", "y", "b"]
    assert interleave([lexical, dense], 10) == ["a", "x", "b", "y", "c"]  # exhausted rankings drop out
    assert interleave([lexical, dense], 0) == [] and interleave([], 3) == [] and interleave([[], dense], 2) == ["x", "a"]


def test_taken_items_are_skipped_and_not_returned():
    assert interleave([["a", "b", "c"], ["a", "d"]], 2, taken=["a"]) == ["b", "d"]
    assert interleave([["a", "b"]], 5, taken=["b", "z"]) == ["a"]


def test_each_rankings_best_share_of_the_places_is_read_where_reciprocal_rank_fusion_drops_it():
    # "gold" is first for BM25 and 30th for MiniLM; c1..c29 are ranked alike by both.
    others = [f"c{i}" for i in range(1, 30)]
    lexical, dense = ["gold", *others], [*others, "gold"]
    chosen = interleave([lexical, dense], 4)
    assert "gold" in chosen and chosen[:2] == ["gold", "c1"]
    # Reciprocal rank fusion (k = 60) scores gold 1/61 + 1/90 and c4 1/65 + 1/64: gold is not in its best 4.
    rrf = {item: sum(1 / (60 + ranking.index(item) + 1) for ranking in (lexical, dense)) for item in lexical}
    assert "gold" not in sorted(rrf, key=rrf.get, reverse=True)[:4]


def test_near_ties_count_the_scores_within_a_tolerance_of_the_best_relative_to_it():
    assert near_ties([10.0, 9.5, 9.1, 5.0], 0.1) == 3
    assert near_ties([16.0, 6.3, 6.1], 0.1) == 1
    assert near_ties([0.66, 0.62, 0.60, 0.58], 0.1) == 3  # cosines: 0.594 is the line
    assert near_ties([], 0.1) == 0
    assert near_ties([0.0, -0.1], 0.1) == 2  # nothing positive to be relative to: all alike


def _ranking(scores):
    return [Hit(0, passage, score) for passage, score in enumerate(scores)]


def test_the_budget_grows_only_when_every_ranking_ties_and_stays_within_its_bounds():
    separated, tied = _ranking([16.0] + [6.0] * 40), _ranking([0.55 - 0.001 * i for i in range(40)])
    assert reading_budget({"bm25": separated, "minilm": tied}, 8, 32) == 8  # BM25 tells them apart
    few_ties = _ranking([10.0] * 6 + [5.0] * 30)
    assert reading_budget({"bm25": few_ties, "minilm": tied}, 8, 32) == 12  # BM25's 6 ties, in turn with MiniLM
    assert reading_budget({"minilm": tied}, 8, 32) == 32  # 40 ties: at most `passages`
    assert reading_budget({"minilm": tied}, 8, 20) == 20
    assert reading_budget({"bm25": []}, 8, 32) == 8  # no word of the question in the documents
    assert reading_budget({}, 3, 32) == 3


def test_options_refuse_unknown_retrievals_and_empty_budgets():
    with pytest.raises(ValueError, match="hybrid, minilm, bm25"):
        RetrievalOptions(retrieval="tfidf")
    with pytest.raises(ValueError, match=">= 1"):
        RetrievalOptions(passages=0)
