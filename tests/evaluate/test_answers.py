"""Scoring one answer against a gold one (longdoc.evaluate.answers): SQuAD's normalisation and HotpotQA's
official answer figures, pinned on hand-computed examples (each value derived in a comment)."""

import pytest

from longdoc.evaluate.answers import MatchScores, answer_scores, normalize_answer


@pytest.mark.parametrize("text, expected", [
    # lowercase; "," and "!" and "-" dropped ("brown-fox" -> "brownfox"); "The" dropped; spaces collapsed
    ("The  Quick, Brown-fox!", "quick brownfox"),
    # a/an/the only as whole words: "theatre" and "another" stay
    ("An apple a day at the theatre, another", "apple day at theatre another"),
    # punctuation goes before articles: "a." becomes "a", then the article rule removes it
    ("Plan a.", "plan"),
    # only ASCII punctuation: the curly quote and the en dash stay
    ("“Heroes” – 1987", "“heroes” – 1987"),
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_answer_token_overlap():
    # "eiffel tower in paris" (4 tokens) vs "eiffel tower" (2): 2 shared tokens.
    # P = 2/4, R = 2/2, F1 = 2 * 0.5 * 1 / 1.5 = 2/3, no exact match.
    scores = answer_scores("the Eiffel Tower in Paris", "Eiffel Tower")
    assert scores == MatchScores(em=0.0, prec=0.5, recall=1.0, f1=pytest.approx(2 / 3))


def test_answer_counts_repeated_tokens_once_per_occurrence():
    # "new new york" vs "new york": common multiset {new: 1, york: 1} = 2 tokens. P = 2/3, R = 1, F1 = 0.8.
    scores = answer_scores("new new york", "New York")
    assert (scores.prec, scores.recall, scores.f1) == (pytest.approx(2 / 3), 1.0, pytest.approx(0.8))


@pytest.mark.parametrize("prediction, gold", [
    ("yes", "no"),
    ("yes it is", "yes"),      # overlaps "yes" by one token, but gold is a yes/no answer
    ("no", "no way"),          # the prediction is "no": no partial credit either way
    ("noanswer", "answer"),    # "noanswer" is on the official list too
])
def test_yes_no_answers_get_no_partial_credit(prediction, gold):
    assert answer_scores(prediction, gold) == MatchScores(em=0.0, prec=0.0, recall=0.0, f1=0.0)


def test_yes_no_matches_after_normalisation():
    assert answer_scores("Yes.", "yes") == MatchScores(em=1.0, prec=1.0, recall=1.0, f1=1.0)


def test_answers_that_normalise_to_nothing_match_exactly_but_share_no_token():
    # Official quirk: "The" and "a" both normalise to "", so EM is 1 while F1, P and R are 0.
    assert answer_scores("The", "a") == MatchScores(em=1.0, prec=0.0, recall=0.0, f1=0.0)
