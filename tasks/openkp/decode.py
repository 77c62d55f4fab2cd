"""OpenKP model outputs -> the official prediction file: one JSON line {"url", "KeyPhrases"} per page.

Per page, over all of its windows: every (n, start word) pair the model scores is a candidate
phrase, the words start .. start + n - 1. Phrases are compared lowercased, as the official metric
matches them (microsoft/OpenKP evaluate.py: tokens lowercased and joined by spaces), so "Web
Application" and "web application" are one phrase, and a phrase scores the best logit over all its
occurrences, in every window (ETC: "the score of a phrase is the max over its occurrences",
Ainslie et al., 2020, section 4). The TOP_K best distinct phrases are written best first, each as
the token list of its best-scoring occurrence as the text spells it. Phrases holding an empty token
(two spaces in a row in the text) are never proposed: the official metric would drop or mangle them.

Beside it, the scores side file (longdoc.data.prediction_scores) holds the SCORED best phrases
(more than the file's TOP_K, so that a reader sees where the model put a gold phrase it did not
write): {"id": url, "keyphrases": [{"phrase": tokens, "score": logit}, ...]}, best first, the
first TOP_K the official file's phrases as it spells them and in its order; the score is the
phrase's best n-gram logit (the ranking above).
"""

import json
from pathlib import Path
from typing import Sequence

import torch

from longdoc.data.examples import StructuredExample
from longdoc.data.prediction import PredictionFile, WindowScores, decode_examples
from longdoc.data.prediction_scores import write_scores
from longdoc.io import atomic_write_text
from longdoc.tasks.openkp.features import collate, feature_settings, window_inputs, window_words, words_of
from longdoc.tasks.openkp.reader import read_examples

TOP_K = 5
SCORED = 20

# One window as the phrase decoder reads it: (its first word in the page, ngram_logits [MAX_NGRAM, W]
# over its W words: entry (n - 1, i) scores the window's words i .. i + n - 1).
WordWindow = tuple[int, torch.Tensor]


def word_window(example: StructuredExample, window: WindowScores) -> WordWindow:
    """The words of one scored window and their n-gram logits (cut to the window's words, as
    `window_inputs`' word_mask counts them)."""
    first, word_ids = window_words(example, window.features)
    return first, window.outputs["ngram_logits"][:, :max(word_ids) + 1]


def phrase_scores(words: Sequence[str], windows: Sequence[WordWindow]) -> dict[str, tuple[float, list[str]]]:
    """{lowercased phrase: (best score over its occurrences, its tokens at that occurrence)}."""
    best: dict[str, tuple[float, list[str]]] = {}
    for first_word, logits in windows:
        for n_index in range(logits.shape[0]):
            n = n_index + 1
            for local in range(logits.shape[1] - n + 1):
                start = first_word + local
                tokens = list(words[start:start + n])
                if len(tokens) < n or any(token == "" for token in tokens):
                    continue
                key = " ".join(token.lower() for token in tokens)
                score = float(logits[n_index, local])
                if key not in best or score > best[key][0]:
                    best[key] = (score, tokens)
    return best


def top_phrases(words: Sequence[str], windows: Sequence[WordWindow], k: int = TOP_K) -> list[tuple[float, list[str]]]:
    """The k best distinct phrases (lowercase-distinct), best first, as (score, token list)."""
    scores = phrase_scores(words, windows)
    return sorted(scores.values(), key=lambda item: -item[0])[:k]


def predict(model, data_path, out_path, *, tokenizer, options=None, tune: bool = False, batch_size: int = 8,
            progress: bool = True) -> PredictionFile:
    """Predict the keyphrases of every page of the OpenKP file `data_path`; write the official
    prediction file (JSON lines) to `out_path` and the phrases' scores beside it (both atomically)."""
    ranked = list(decode_examples(
        model, lambda: read_examples(data_path), tokenizer=tokenizer, settings=feature_settings(model.config),
        inputs=window_inputs, collate=collate, batch_size=batch_size, progress=progress, desc="predict",
        decode=lambda example, windows: (example.labels["url"], top_phrases(
            words_of(example), [word_window(example, w) for w in windows], k=SCORED))))
    lines = [json.dumps({"url": url, "KeyPhrases": [tokens for _, tokens in phrases[:TOP_K]]}, ensure_ascii=False)
             for url, phrases in ranked]
    atomic_write_text(out_path, "".join(line + "\n" for line in lines))
    scores = write_scores(out_path, ({"id": url, "keyphrases": [{"phrase": tokens, "score": score}
                                                                for score, tokens in phrases]}
                                     for url, phrases in ranked))
    return PredictionFile(Path(out_path), len(lines), scores=scores)
