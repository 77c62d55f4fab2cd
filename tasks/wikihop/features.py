"""WikiHop examples -> training rows and batches: ETC's construction (Ainslie et al., 2020,
arXiv:2004.08483, section 4; google-research/google-research etcmodel/models/wikihop/data_utils.py).

Long input: [CLS] query [SEP] then the candidate list (each candidate's text once, ETC puts the
candidates' wordpieces first in the long input), then the supports, each split into paragraphs
and sentences, [SEP]. Global input: CLS, one token per query wordpiece, one token per candidate,
then paragraph and sentence tokens (`longdoc.data.features.build_features`). A candidate's own
text in the list and its mentions in the supports are linked to its global token (`mention_ids`,
the "linked" relative id), so each candidate token has text of its own to read; the query
and candidate globals see every long token despite hard g2l (`global_sees_all`), as in ETC's
WikiHop runner (google-research/google-research, etcmodel/models/wikihop: candidate_ignore_hard_g2l,
query_ignore_hard_g2l, enable_l2g_linking).

Supports longer than the encoder are cut, as ETC cuts them at its long input length: an example
reads its first window only (`long_max_len` wordpieces with the query), and one warning per
file counts the examples cut and the support wordpieces they lose. Candidates past the global
budget are dropped by the feature builder (warned there); a training example whose answer
candidate was dropped gets no label (-1) and is left out of training (counted in a warning).

Per row, beside the model inputs: `candidate_mask` [G] (1 on candidate globals) and `label`
(the global index of the answer's candidate token, -1 for none).
"""

import warnings
from typing import Any, Sequence

import torch
from tqdm.auto import tqdm

from longdoc.data.batching import collate_features
from longdoc.data.examples import Candidate, Document, StructuredExample, TextSpan
from longdoc.data.features import FeatureSettings, Features, GlobalKind, GlobalMarkers, build_features, window_settings
from longdoc.model.heads import IGNORE_INDEX
from longdoc.model.inputs import InputSpec
from longdoc.tasks.wikihop.reader import read_examples

# The rows' keys beside the encoder inputs, as `collate` batches them (the label only in training rows).
EXTRA_INPUTS = (
    InputSpec("candidate_mask", ("batch", "global"), torch.long, pad=0),
    InputSpec("label", ("batch",), torch.long),
)


def feature_settings(config) -> FeatureSettings:
    """The input settings of a model config (a GlobalLocalConfig with the task's `task_options`)."""
    return window_settings("wikihop", config, ("max_question_len",))


class CutCounter:
    """Counts what cutting supports to the first window loses, for one warning per file."""

    def __init__(self):
        self.examples = self.cut_examples = self.cut_wordpieces = self.total_wordpieces = 0

    def first_window(self, windows: list[Features]) -> Features:
        self.add(windows[0].window_end, windows[-1].window_end)
        return windows[0]

    def add(self, kept: int, total: int) -> None:
        """Count an example of `total` wordpieces of which its first window reads `kept`."""
        self.examples += 1
        self.total_wordpieces += total
        if kept < total:
            self.cut_examples += 1
            self.cut_wordpieces += total - kept

    def warn(self, path, long_max_len: int) -> None:
        if self.cut_examples:
            share = self.cut_wordpieces / max(self.total_wordpieces, 1)
            warnings.warn(
                f"{path}: {self.cut_examples} of {self.examples} examples have supports longer than long_max_len "
                f"{long_max_len} allows; cut after their first window: {self.cut_wordpieces} of "
                f"{self.total_wordpieces} wordpieces of candidate list and supports ({share:.1%}) not read",
                stacklevel=3,
            )


def with_candidate_list(example: StructuredExample) -> StructuredExample:
    """`example` with a first document listing the candidates, one per line, each line a mention of its
    candidate (the supports move one document index on)."""
    text, own = "", []
    for candidate in example.candidates:
        own.append(TextSpan(0, len(text), len(text) + len(candidate.text)))
        text += candidate.text + "\n"
    candidates = [
        Candidate(c.text, [span, *(TextSpan(m.document + 1, m.start, m.end) for m in c.mentions)])
        for c, span in zip(example.candidates, own)
    ]
    return StructuredExample(id=example.id, question=example.question, documents=[Document(text), *example.documents],
                             candidates=candidates, labels=example.labels)


def example_window(example: StructuredExample, tokenizer, settings: FeatureSettings, markers: GlobalMarkers,
                   cuts: CutCounter) -> Features:
    """The first window of `example` with its candidate list (what the model reads; see the module docstring)."""
    return cuts.first_window(build_features(with_candidate_list(example), tokenizer, settings, markers))


def window_inputs(features: Features) -> dict[str, Any]:
    """The model inputs of one window plus the candidate mask (no label)."""
    row = features.model_inputs()
    row["candidate_mask"] = [int(kind == GlobalKind.CANDIDATE) for kind in features.global_kinds]
    return row


def window_row(example: StructuredExample, features: Features) -> dict[str, Any]:
    row = window_inputs(features)
    answer = example.labels["answer_index"]
    row["label"] = next((g for g, (kind, item) in enumerate(zip(features.global_kinds, features.global_item_ids))
                         if kind == GlobalKind.CANDIDATE and item == answer), IGNORE_INDEX)
    return row


def training_features(path, tokenizer, config, options=None, progress: bool = True) -> list[dict[str, Any]]:
    """One labelled row per example of the WikiHop file `path`."""
    settings = feature_settings(config)
    markers = GlobalMarkers.from_tokenizer(tokenizer)
    cuts, rows = CutCounter(), []
    for example in tqdm(read_examples(path), desc=f"features {path}", unit=" examples", disable=not progress):
        rows.append(window_row(example, example_window(example, tokenizer, settings, markers, cuts)))
    cuts.warn(path, settings.long_max_len)
    labelled = [row for row in rows if row["label"] != IGNORE_INDEX]
    if len(labelled) < len(rows):
        warnings.warn(f"{path}: {len(rows) - len(labelled)} of {len(rows)} examples lost their answer candidate to "
                      f"global_max_len {settings.global_max_len}; left out of training", stacklevel=2)
    return labelled


def collate(rows: Sequence[dict[str, Any]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """A padded batch of rows (labelled or not) that goes straight into `WikiHopModel(**batch)`."""
    return collate_features(rows, pad_token_id, EXTRA_INPUTS)
