"""OpenKP model outputs -> the official prediction file: one JSON line {"url", "KeyPhrases"} per page.

Per page, over all of its windows: every (n, start word) pair the model scores is a candidate
phrase, the words start .. start + n - 1. Phrases are compared lowercased, as the official metric
matches them (microsoft/OpenKP evaluate.py: tokens lowercased and joined by spaces), so "Web
Application" and "web application" are one phrase, and a phrase scores the best logit over all its
occurrences, in every window (ETC: "the score of a phrase is the max over its occurrences",
Ainslie et al., 2020, section 4). The TOP_K best distinct phrases are written best first, each as
the token list of its best-scoring occurrence as the text spells it. Phrases holding an empty token
(two spaces in a row in the text) are never proposed: the official metric would drop or mangle them.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from longdoc.data.examples import StructuredExample
from longdoc.data.features import GlobalMarkers, build_features
from longdoc.io import atomic_write_text
from longdoc.tasks.openkp.features import collate, feature_settings, window_inputs, window_words, words_of
from longdoc.tasks.openkp.reader import read_examples

TOP_K = 5


@dataclass
class WindowScores:
    first_word: int  # the window's first word in the page
    ngram_logits: torch.Tensor  # [MAX_NGRAM, >= W]: (n - 1, i) scores the window's words i .. i + n - 1
    num_words: int  # W, the window's words


def phrase_scores(words: Sequence[str], windows: Sequence[WindowScores]) -> dict[str, tuple[float, list[str]]]:
    """{lowercased phrase: (best score over its occurrences, its tokens at that occurrence)}."""
    best: dict[str, tuple[float, list[str]]] = {}
    for window in windows:
        logits = window.ngram_logits.float()
        for n_index in range(logits.shape[0]):
            n = n_index + 1
            for local in range(window.num_words - n + 1):
                start = window.first_word + local
                tokens = list(words[start:start + n])
                if len(tokens) < n or any(token == "" for token in tokens):
                    continue
                key = " ".join(token.lower() for token in tokens)
                score = float(logits[n_index, local])
                if key not in best or score > best[key][0]:
                    best[key] = (score, tokens)
    return best


def top_phrases(words: Sequence[str], windows: Sequence[WindowScores], k: int = TOP_K) -> list[list[str]]:
    """The k best distinct phrases (lowercase-distinct), best first, as token lists."""
    scores = phrase_scores(words, windows)
    ranked = sorted(scores.values(), key=lambda item: -item[0])
    return [tokens for _, tokens in ranked[:k]]


def predict(model, data_path, out_path, *, tokenizer, options=None, batch_size: int = 8,
            progress: bool = True) -> Path:
    """Predict the keyphrases of every page of the OpenKP file `data_path`; write the official
    prediction file (JSON lines) to `out_path` (atomically) and return its path."""
    examples: list[StructuredExample] = list(read_examples(data_path))
    settings = feature_settings(model.config)
    markers = GlobalMarkers.from_tokenizer(tokenizer)
    windows = [(e, features) for e, example in enumerate(examples)
               for features in build_features(example, tokenizer, settings, markers)]
    rows = [window_inputs(examples[e], features) for e, features in windows]
    outputs = model.forward_rows(rows, collate, batch_size, progress=progress, desc="openkp predict")
    per_example: list[list[WindowScores]] = [[] for _ in examples]
    for (e, features), row, output in zip(windows, rows, outputs):
        first, _ = window_words(examples[e], features)
        per_example[e].append(WindowScores(first, output["ngram_logits"].float().cpu(), len(row["word_mask"])))
    lines = [json.dumps({"url": example.labels["url"], "KeyPhrases": top_phrases(words_of(example), scores)},
                        ensure_ascii=False)
             for example, scores in zip(examples, per_example)]
    atomic_write_text(out_path, "".join(line + "\n" for line in lines))
    return Path(out_path)
