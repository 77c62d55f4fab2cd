"""OpenKP examples -> training rows and batches: ETC's OpenKP construction (Ainslie et al., 2020,
arXiv:2004.08483, section 4; google-research/google-research etcmodel/models/openkp/generate_examples_lib.py).

Long input per window: `[CLS] [SEP] window of the page text [SEP]` (OpenKP has no question);
global input: CLS and one token per visual DOM node in the window, its 20 visual features
projected into its embedding (`global_features`, the encoder's `global_feature_size` = 20;
`longdoc.data.features.build_features` lays them out and links each node's tokens to it). ETC:
Ainslie et al., 2020, section 4.

Words are the page's tokens (`text.split(" ")`, as the official files tokenise). Per window:
- `word_ids` [L]: for each long token the index of its word among the window's words (0 for the
  window's first word), -1 for [CLS]/[SEP]; the model pools wordpiece outputs per word;
- `word_mask` [W]: 1 for each of the window's words;
- with labels, `ngram_labels` [MAX_NGRAM, W]: 1 at (n - 1, i) when words i .. i + n - 1 of the
  window are a gold keyphrase, matched lowercased (the official metric lowercases), at every
  occurrence that lies whole in the window; 0 elsewhere.
Keyphrases longer than MAX_NGRAM words, or found nowhere in the text, cannot be targets; one
warning counts them. Training keeps only windows with at least one target.
"""

import bisect
import warnings
from typing import Any, Sequence

import torch
from tqdm.auto import tqdm

from longdoc.data.batching import collate_features
from longdoc.data.examples import StructuredExample
from longdoc.data.features import FeatureSettings, Features, GlobalMarkers, build_features, window_settings
from longdoc.model.inputs import InputSpec
from longdoc.tasks.openkp.reader import VISUAL_FEATURE_SIZE, read_examples

MAX_NGRAM = 5
ROW_SPECS = (
    InputSpec("word_ids", ("batch", "long"), torch.long, pad=-1),
    InputSpec("word_mask", ("batch", "word"), torch.long, pad=0),
    InputSpec("ngram_labels", ("batch", MAX_NGRAM, "word"), torch.float32, pad=0.0),
)


def feature_settings(config) -> FeatureSettings:
    """The window settings of a model config (a GlobalLocalConfig with the task's `task_options`)."""
    return window_settings("openkp", config, ("stride",), max_question_len=0, global_feature_size=VISUAL_FEATURE_SIZE)


def words_of(example: StructuredExample) -> list[str]:
    return example.documents[0].text.split(" ")


def window_words(example: StructuredExample, features: Features) -> tuple[int, list[int]]:
    """(the window's first word, word_ids [L]) of one window (see the module docstring)."""
    starts, start = [], 0
    for word in words_of(example):
        starts.append(start)
        start += len(word) + 1
    words = [bisect.bisect_right(starts, offsets[0]) - 1 if source == 0 else -1
             for offsets, source in zip(features.long_offsets, features.long_source_ids)]
    first = min((w for w in words if w >= 0), default=0)
    return first, [w - first if w >= 0 else -1 for w in words]


def window_inputs(example: StructuredExample, features: Features) -> dict[str, Any]:
    """The model inputs of one window plus `word_ids` and `word_mask` (no labels)."""
    row = features.model_inputs()
    _, row["word_ids"] = window_words(example, features)
    row["word_mask"] = [1] * (max(row["word_ids"]) + 1)
    return row


def keyphrase_starts(words: Sequence[str], phrase: Sequence[str]) -> list[int]:
    """Every word index where `phrase` occurs in `words`, compared lowercased."""
    target = [token.lower() for token in phrase]
    lowered = [word.lower() for word in words]
    n = len(target)
    return [i for i in range(len(lowered) - n + 1) if lowered[i:i + n] == target]


def window_row(example: StructuredExample, features: Features, phrases: Sequence[Sequence[str]]) -> dict[str, Any]:
    """One labelled row: `window_inputs` plus `ngram_labels`."""
    row = window_inputs(example, features)
    first, _ = window_words(example, features)
    num_words = len(row["word_mask"])
    labels = [[0.0] * num_words for _ in range(MAX_NGRAM)]
    words = words_of(example)
    for phrase in phrases:
        for start in keyphrase_starts(words, phrase):
            local = start - first
            if 0 <= local and local + len(phrase) <= num_words:
                labels[len(phrase) - 1][local] = 1.0
    row["ngram_labels"] = labels
    return row


def usable_phrases(example: StructuredExample) -> tuple[list[list[str]], int]:
    """(the gold keyphrases that can be targets, how many cannot: empty, too long or absent)."""
    phrases = [phrase for phrase in example.labels.get("KeyPhrases", []) if phrase and phrase[0]]
    words = words_of(example)
    usable = [p for p in phrases if len(p) <= MAX_NGRAM and keyphrase_starts(words, p)]
    return usable, len(phrases) - len(usable)


def training_features(path, tokenizer, config, options=None, progress: bool = True) -> list[dict[str, Any]]:
    """Every window with at least one keyphrase target, of every example in the OpenKP file `path`."""
    settings = feature_settings(config)
    markers = GlobalMarkers.from_tokenizer(tokenizer)
    rows, unusable, total = [], 0, 0
    for example in tqdm(read_examples(path), desc=f"features {path}", unit=" examples", disable=not progress):
        phrases, missing = usable_phrases(example)
        unusable += missing
        total += len(phrases) + missing
        for features in build_features(example, tokenizer, settings, markers):
            row = window_row(example, features, phrases)
            if any(any(line) for line in row["ngram_labels"]):
                rows.append(row)
    if unusable:
        warnings.warn(f"{path}: {unusable} of {total} keyphrases are longer than {MAX_NGRAM} words or do not occur in "
                      "their text: no training target", stacklevel=2)
    return rows


def collate(rows: Sequence[dict[str, Any]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """A padded batch of rows (labelled or not) that goes straight into `OpenKPModel(**batch)`."""
    return collate_features(rows, pad_token_id, extra=ROW_SPECS)
