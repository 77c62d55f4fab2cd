"""ROUGE-L through rouge-score, pinned on a hand-computed pair."""

import pytest

from longdoc.evaluate.rouge import RougeScore, rouge_l


def test_rouge_l_hand_computed():
    # rouge-score tokens: [the, eiffel, tower, in, paris] vs [eiffel, tower]; LCS 2.
    # P = 2/5, R = 2/2, F = 2 * 0.4 * 1 / 1.4 = 4/7.
    assert rouge_l("The Eiffel Tower, in Paris", "Eiffel Tower") == RougeScore(
        precision=0.4, recall=1.0, f1=pytest.approx(4 / 7))


def test_rouge_l_subsequence_not_substring():
    # LCS of [a, b, c, d] and [a, x, c, d] is [a, c, d]: 3 of 4 on each side.
    assert rouge_l("a x c d", "a b c d").f1 == pytest.approx(0.75)


def test_text_without_ascii_letters_or_digits_scores_zero():
    # rouge-score's tokenizer keeps only [a-z0-9]: no tokens, score 0 even against itself.
    assert rouge_l("Москва", "Москва").f1 == 0.0
