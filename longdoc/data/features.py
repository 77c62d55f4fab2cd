"""Structured example -> encoder features: long and global ids, structure ids, masks, offsets, windows.

Construction (ETC, Ainslie et al. 2020, arXiv:2004.08483, sections 3 and 4):

Long input, per window: `[CLS] question [SEP] document tokens of the window [SEP]`. Documents
follow each other in order; every window repeats [CLS], the question and [SEP] (ETC NQ).

Global input, per window, in this order:
- CLS: the tokenizer's [CLS] id; sees all long tokens (`global_sees_all`).
- QUESTION: one per question wordpiece, with that wordpiece's id (or the model's question marker,
  `GlobalMarkers.question`); sees all.
- CANDIDATE: one per answer candidate (WikiHop), every window; sees all. The long tokens of a
  candidate's mentions point to it through `mention_ids` (longest mention wins where mentions
  overlap; ties go to the earlier candidate).
- then the structure tokens, each placed where its first long token in the window is, so globals
  follow the long tokens they own: PARAGRAPH (one per paragraph), SENTENCE (one per sentence),
  DOM_NODE (one per visual DOM node, with its feature vector in `global_features`).
Input ids of non-question globals are kind markers (`GlobalMarkers`): the model config's
`global_token_ids` when it names them (a converted ETC checkpoint: the ids etcmodel pretrained and
fine-tuned with), else BERT's [unused0..3] when the vocabulary has them, otherwise distinct special
tokens of the tokenizer (see `from_tokenizer`).
Token types (`TokenTypes`, from the model config; longdoc's defaults in brackets): the long
[CLS] question [SEP] prefix (0), the document's long tokens and the final [SEP] (1), CLS and
question globals (0, like the question's long tokens), every other global (1); kinds are told apart
by their marker ids, so two types keep BERT's type table usable. A converted ETC checkpoint has
etcmodel's: 1 for every long token, 0 for every global token.

`sentence_ids` (the "belongs to" link): a question long token points to its question global,
[CLS] and [SEP] to the CLS global, a document token to its most specific kept owner: its DOM node
(the smallest containing one), else its sentence, else its paragraph (title tokens and tokens
between sentences belong to the paragraph token), else -1.
`long_paragraph_ids`: 0 for the [CLS] question [SEP] prefix (and the final [SEP]); then each run of
document tokens in the same paragraph, or in the same gap between paragraphs, gets the next id.
`global_paragraph_ids`: 0 for CLS, question and candidate globals; a structure global gets the id
of its first long token.

Limits: the question keeps at most `max_question_len` wordpieces; the document part of the long
input is windowed by `longdoc.data.windows.plan_windows` with overlap `stride` (never inside a character); when a window needs more
globals than `global_max_len`, candidates past the budget and then structure globals in long order
are dropped (a dropped owner's tokens fall back to the next kept owner). Every drop is warned about
with counts. Tokenisation is done piece by piece between structure boundaries, so no token
straddles a sentence, paragraph, mention or DOM node boundary. Offsets exclude whitespace at a
token's ends (byte-level BPE tokens carry their leading space), except for whitespace-only tokens.
"""

import bisect
import warnings
from collections import Counter
from dataclasses import asdict, dataclass
from enum import IntEnum
from typing import Sequence

from longdoc.errors import InputError, OptionError
from longdoc.data.examples import StructuredExample
from longdoc.data.spans import SOURCE_NONE, SOURCE_QUESTION
from longdoc.data.windows import Window, plan_windows
from longdoc.model.config import GlobalLocalConfig
from longdoc.model.inputs import encoder_inputs

class GlobalKind(IntEnum):
    CLS = 0
    QUESTION = 1
    CANDIDATE = 2
    PARAGRAPH = 3
    SENTENCE = 4
    DOM_NODE = 5


@dataclass(frozen=True)
class GlobalMarkers:
    """Input ids of the paragraph, sentence, candidate and DOM-node global tokens; `question`: the
    id of every question global (None: each carries its question wordpiece); `cpc_mask`: the id of
    a sentence's global token when pretraining masks the sentence for CPC (None: it keeps
    `sentence`)."""

    paragraph: int
    sentence: int
    candidate: int
    dom_node: int
    question: int | None = None
    cpc_mask: int | None = None

    @classmethod
    def from_config(cls, config: GlobalLocalConfig) -> "GlobalMarkers | None":
        """The model config's `global_token_ids`; None when it names none."""
        return None if config.global_token_ids is None else cls(**config.global_token_ids)

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "GlobalMarkers":
        """[unused0..3] (BERT WordPiece vocabularies) when present; otherwise the first four distinct
        ids among the tokenizer's additional special tokens and then sep/eos, mask, unk, pad (for
        RoBERTa-style BPE: </s>, <mask>, <unk>, <pad>), never the [CLS]/<s> id that CLS globals use."""
        vocab = tokenizer.get_vocab()
        unused = [vocab.get(f"[unused{i}]") for i in range(4)]
        if all(i is not None for i in unused):
            return cls(*unused)
        candidates = [tokenizer.convert_tokens_to_ids(t) for t in _additional_special_tokens(tokenizer)]
        candidates += [tokenizer.sep_token_id, tokenizer.eos_token_id, tokenizer.mask_token_id,
                       tokenizer.unk_token_id, tokenizer.pad_token_id]
        chosen = []
        for token_id in candidates:
            if token_id is not None and token_id != _cls_id(tokenizer) and token_id not in chosen:
                chosen.append(token_id)
        if len(chosen) < 4:
            raise ValueError(
                f"tokenizer {type(tokenizer).__name__} has no [unused0..3] and fewer than 4 distinct special "
                "tokens for global markers; add special tokens or pass GlobalMarkers explicitly"
            )
        return cls(*chosen[:4])


@dataclass(frozen=True)
class TokenTypes:
    """The token type ids the feature builders give (a model config's input conventions; the
    defaults are longdoc's): the long [CLS] question [SEP] prefix, the long document tokens (and the
    final [SEP]; every long token in pretraining), CLS and question globals, every other global
    (every global in pretraining)."""

    long_question: int = 0
    long_document: int = 1
    global_question: int = 0
    global_structure: int = 1

    @classmethod
    def from_config(cls, config: GlobalLocalConfig) -> "TokenTypes":
        return cls(config.long_question_token_type_id, config.long_document_token_type_id,
                   config.global_question_token_type_id, config.global_structure_token_type_id)


@dataclass(frozen=True)
class FeatureSettings:
    """Lengths of one encoder input. `stride`: overlap in tokens between consecutive windows.
    `token_types`, `markers`: the model's input conventions (`window_settings` reads them from its
    config); `markers` None: the markers given to `build_features`, else the tokenizer's."""

    long_max_len: int
    global_max_len: int
    stride: int = 0
    max_question_len: int = 64
    global_feature_size: int = 0
    token_types: TokenTypes = TokenTypes()
    markers: GlobalMarkers | None = None

    def __post_init__(self):
        if self.max_question_len < 0:
            raise ValueError(f"max_question_len must be >= 0, got {self.max_question_len}")
        if self.long_max_len < self.max_question_len + 4:
            raise ValueError(
                f"long_max_len ({self.long_max_len}) must leave room for [CLS], {self.max_question_len} question "
                "tokens, two [SEP] and one document token (max_question_len + 4)"
            )
        if self.global_max_len < self.max_question_len + 1:
            raise ValueError(
                f"global_max_len ({self.global_max_len}) must hold CLS and max_question_len "
                f"({self.max_question_len}) question globals"
            )
        # The shortest window (longest question) must still advance past its overlap.
        shortest_window = self.long_max_len - self.max_question_len - 3
        if not 0 <= self.stride < shortest_window:
            raise ValueError(
                f"stride must be in [0, {shortest_window}) (long_max_len - max_question_len - 3), got {self.stride}"
            )


def window_settings(task: str, config: GlobalLocalConfig, names: Sequence[str], **fixed) -> FeatureSettings:
    """The window settings of a `task` model config: its lengths, its input conventions, the
    `task_options` listed in `names` (e.g. stride, max_question_len) and the task's `fixed` settings.
    Settings that do not fit together are an OptionError naming the options that set them, with
    their values."""
    chosen = {"long_max_len": config.long_max_len, "global_max_len": config.global_max_len,
              **{name: config.task_options[name] for name in names}}
    conventions = dict(token_types=TokenTypes.from_config(config), markers=GlobalMarkers.from_config(config))
    try:
        return FeatureSettings(**chosen, **fixed, **conventions)
    except ValueError as error:
        named = ", ".join(f"{{{name}}} {{value_of_{name}}}" for name in chosen)
        raise OptionError(f"{{task}} windows ({named}): {{reason}}", task=task, reason=error,
                          **{f"value_of_{name}": value for name, value in chosen.items()}) from None


@dataclass
class Features:
    """One window of one example, unpadded (`longdoc.data.batching.collate_features` pads a batch).

    Fields named in the input schema (`longdoc.model.inputs.ENCODER_INPUTS`: the
    `GlobalLocalModel.forward` arguments, with their axes) are model inputs, as lists with one
    level per axis after "batch"; the rest is bookkeeping: `long_offsets` [L, 2] character [start, end) of each long token in
    its source, `long_source_ids` [L] (document index, SOURCE_QUESTION or SOURCE_NONE),
    `global_kinds` [G] (GlobalKind), `global_item_ids` [G] (question wordpiece / candidate /
    flat paragraph / flat sentence / DOM node index, -1 for CLS), `window_start`/`window_end`
    (this window's range in the example's document tokens).
    """

    example_id: str
    window_index: int
    window_start: int
    window_end: int
    long_input_ids: list[int]
    long_attention_mask: list[int]
    long_token_type_ids: list[int]
    sentence_ids: list[int]
    mention_ids: list[int]
    long_paragraph_ids: list[int]
    long_offsets: list[list[int]]
    long_source_ids: list[int]
    global_input_ids: list[int]
    global_attention_mask: list[int]
    global_token_type_ids: list[int]
    global_paragraph_ids: list[int]
    global_sees_all: list[bool]
    global_kinds: list[int]
    global_item_ids: list[int]
    global_features: list[list[float]] | None = None

    def to_dict(self) -> dict:
        record = asdict(self)
        if record["global_features"] is None:
            del record["global_features"]
        return record

    def model_inputs(self) -> dict:
        """The model-input fields only (a training row's start; tasks add their labels to it)."""
        return encoder_inputs(vars(self))


@dataclass
class _DocumentTokens:
    """The document tokens of a whole example, concatenated over documents, with their owners."""

    ids: list[int]
    offsets: list[list[int]]
    sources: list[int]
    paragraph: list[int]  # flat paragraph index or -1
    sentence: list[int]  # flat sentence index or -1
    dom_node: list[int]  # DOM node index or -1
    mention: list[int]  # candidate index or -1
    segment: list[int]  # long_paragraph_ids value


def build_features(
    example: StructuredExample, tokenizer, settings: FeatureSettings, markers: GlobalMarkers | None = None
) -> list[Features]:
    """The features of every window of `example` (one window when the documents fit). The markers
    of `settings` (the model's own, from its config) come before `markers`, then the tokenizer's."""
    example.validate()
    markers = settings.markers or markers or GlobalMarkers.from_tokenizer(tokenizer)
    _check_dom_features(example, settings.global_feature_size)
    question = tokenizer(example.question, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    question_ids = question["input_ids"]
    question_offsets = [_trimmed(example.question, s, e) for s, e in question["offset_mapping"]]
    if len(question_ids) > settings.max_question_len:
        warnings.warn(
            f"example {example.id!r}: question truncated from {len(question_ids)} to {settings.max_question_len} "
            "wordpieces (max_question_len)", stacklevel=2,
        )
        question_ids = question_ids[: settings.max_question_len]
        question_offsets = question_offsets[: settings.max_question_len]
    tokens = _ExampleTokens(question_ids, question_offsets, _tokenize_documents(example, tokenizer), _cls_id(tokenizer),
                            _sep_id(tokenizer))
    # The window takes all room the actual question leaves: long_max_len - [CLS] - question - 2 [SEP].
    window_len = settings.long_max_len - len(question_ids) - 3

    def can_cut(position: int) -> bool:
        # Never between two tokens of one character (byte-level BPE splits a character's bytes).
        return tokens.documents.offsets[position - 1][1] <= tokens.documents.offsets[position][0]

    features, dropped = [], Counter()
    for index, window in enumerate(plan_windows(len(tokens.documents.ids), window_len, settings.stride, can_cut)):
        global_tokens, dropped_here = _window_globals(example, tokens, settings, markers, window)
        features.append(_window_features(example, tokens, settings, index, window, global_tokens))
        dropped += dropped_here
    if dropped:
        counts = ", ".join(f"{count} {kind.name.lower()}" for kind, count in sorted(dropped.items()))
        warnings.warn(
            f"example {example.id!r}: global_max_len {settings.global_max_len} too small; dropped global tokens "
            f"over {len(features)} window(s): {counts}", stacklevel=2,
        )
    return features


@dataclass(frozen=True)
class _ExampleTokens:
    """What every window of an example is built from: its question's wordpieces (truncated) and their
    offsets, its documents' tokens, and the tokenizer's [CLS] and [SEP] ids."""

    question_ids: list[int]
    question_offsets: list[list[int]]
    documents: _DocumentTokens
    cls_id: int
    sep_id: int


@dataclass(frozen=True)
class _GlobalToken:
    """One global token of a window: its kind, its item (see `Features.global_item_ids`), its input
    id and its paragraph id."""

    kind: GlobalKind
    item: int
    input_id: int
    paragraph: int


def _window_globals(example: StructuredExample, tokens: _ExampleTokens, settings: FeatureSettings,
                    markers: GlobalMarkers, window: Window) -> tuple[list[_GlobalToken], Counter]:
    """The global tokens of `window` in their order (CLS, question, candidates, then structure
    tokens), and the number dropped of each kind: candidates past `global_max_len`, then structure
    tokens in long order."""
    question_ids = tokens.question_ids if markers.question is None else [markers.question] * len(tokens.question_ids)
    always = [_GlobalToken(GlobalKind.CLS, -1, tokens.cls_id, 0),
              *(_GlobalToken(GlobalKind.QUESTION, q, input_id, 0) for q, input_id in enumerate(question_ids))]
    candidates = [_GlobalToken(GlobalKind.CANDIDATE, c, markers.candidate, 0) for c in range(len(example.candidates))]
    structure = _structure_globals(tokens.documents, markers, window)
    budget = settings.global_max_len - len(always)
    kept_candidates = candidates[:budget]
    kept_structure = structure[:budget - len(kept_candidates)]
    dropped = Counter(token.kind for token in [*candidates[len(kept_candidates):], *structure[len(kept_structure):]])
    return [*always, *kept_candidates, *kept_structure], dropped


def _structure_globals(documents: _DocumentTokens, markers: GlobalMarkers, window: Window) -> list[_GlobalToken]:
    """The paragraph, sentence and DOM node tokens of `window`, each placed where its first long token
    in the window is (a paragraph before its first sentence, a sentence before its DOM nodes)."""
    marker_of = {GlobalKind.PARAGRAPH: markers.paragraph, GlobalKind.SENTENCE: markers.sentence,
                 GlobalKind.DOM_NODE: markers.dom_node}
    found: dict[tuple[GlobalKind, int], _GlobalToken] = {}  # in insertion order: long order
    for t in range(window.start, window.end):
        for kind, item in ((GlobalKind.PARAGRAPH, documents.paragraph[t]), (GlobalKind.SENTENCE, documents.sentence[t]),
                           (GlobalKind.DOM_NODE, documents.dom_node[t])):
            if item >= 0 and (kind, item) not in found:
                found[(kind, item)] = _GlobalToken(kind, item, marker_of[kind], documents.segment[t])
    return list(found.values())


def _window_features(example: StructuredExample, tokens: _ExampleTokens, settings: FeatureSettings,
                     window_index: int, window: Window, global_tokens: list[_GlobalToken]) -> Features:
    """The features of one window: its long tokens ([CLS] question [SEP] window [SEP]) and its
    `global_tokens`, linked as the module docstring says."""
    documents, types = tokens.documents, settings.token_types
    index_of = {(token.kind, token.item): index for index, token in enumerate(global_tokens)}
    doc = range(window.start, window.end)
    num_question = len(tokens.question_ids)
    prefix = 2 + num_question  # [CLS] question [SEP]
    long_ids = [tokens.cls_id, *tokens.question_ids, tokens.sep_id, *(documents.ids[t] for t in doc), tokens.sep_id]
    none = [SOURCE_NONE]
    kinds = [token.kind for token in global_tokens]
    features = Features(
        example_id=example.id,
        window_index=window_index,
        window_start=window.start,
        window_end=window.end,
        long_input_ids=long_ids,
        long_attention_mask=[1] * len(long_ids),
        long_token_type_ids=[types.long_question] * prefix + [types.long_document] * (len(doc) + 1),
        sentence_ids=[0, *(1 + q for q in range(num_question)), 0, *(_owner(index_of, documents, t) for t in doc), 0],
        mention_ids=[-1] * prefix + [index_of.get((GlobalKind.CANDIDATE, documents.mention[t]), -1) for t in doc]
                    + [-1],
        long_paragraph_ids=[0] * prefix + [documents.segment[t] for t in doc] + [0],
        long_offsets=[[-1, -1], *tokens.question_offsets, [-1, -1], *(documents.offsets[t] for t in doc), [-1, -1]],
        long_source_ids=none + [SOURCE_QUESTION] * num_question + none + [documents.sources[t] for t in doc] + none,
        global_input_ids=[token.input_id for token in global_tokens],
        global_attention_mask=[1] * len(global_tokens),
        global_token_type_ids=[types.global_question if kind in (GlobalKind.CLS, GlobalKind.QUESTION)
                               else types.global_structure for kind in kinds],
        global_paragraph_ids=[token.paragraph for token in global_tokens],
        global_sees_all=[kind in (GlobalKind.CLS, GlobalKind.QUESTION, GlobalKind.CANDIDATE) for kind in kinds],
        global_kinds=[int(kind) for kind in kinds],
        global_item_ids=[token.item for token in global_tokens],
    )
    if settings.global_feature_size:
        zeros = [0.0] * settings.global_feature_size
        features.global_features = [
            [float(v) for v in example.dom_nodes[token.item].features] if token.kind == GlobalKind.DOM_NODE else zeros
            for token in global_tokens
        ]
    return features


def _owner(index_of: dict[tuple[GlobalKind, int], int], documents: _DocumentTokens, t: int) -> int:
    """The global token document token t belongs to: its most specific kept owner (its DOM node, else
    its sentence, else its paragraph), else -1."""
    for key in ((GlobalKind.DOM_NODE, documents.dom_node[t]), (GlobalKind.SENTENCE, documents.sentence[t]),
                (GlobalKind.PARAGRAPH, documents.paragraph[t])):
        if key in index_of:
            return index_of[key]
    return -1


def _tokenize_documents(example: StructuredExample, tokenizer) -> _DocumentTokens:
    out = _DocumentTokens([], [], [], [], [], [], [], [])
    paragraph_base = sentence_base = 0
    segment, previous_region = 0, None
    for d, document in enumerate(example.documents):
        text = document.text
        spans_here = _structure_spans(example, d)
        cuts = sorted({0, len(text), *(point for start, end in spans_here for point in (start, end))})
        pieces = [(a, b) for a, b in zip(cuts, cuts[1:]) if not text[a:b].isspace()]
        # verbose=False: pieces longer than the tokenizer's own limit are fine, windows handle length.
        encoded = (tokenizer([text[a:b] for a, b in pieces], add_special_tokens=False, return_offsets_mapping=True,
                             verbose=False)
                   if pieces else {"input_ids": [], "offset_mapping": []})
        first_token = len(out.ids)
        for (a, _), ids, offsets in zip(pieces, encoded["input_ids"], encoded["offset_mapping"]):
            out.ids.extend(ids)
            out.offsets.extend(_trimmed(text, a + s, a + e) for s, e in offsets)
        count = len(out.ids) - first_token
        out.sources.extend([d] * count)
        starts = [out.offsets[first_token + i][0] for i in range(count)]

        def token_range(start: int, end: int) -> range:
            return range(first_token + bisect.bisect_left(starts, start), first_token + bisect.bisect_left(starts, end))

        paragraph, sentence = [-1] * count, [-1] * count
        for p, par in enumerate(document.paragraphs):
            for t in token_range(par.span.start, par.span.end):
                paragraph[t - first_token] = paragraph_base + p
            for s, sen in enumerate(par.sentences):
                for t in token_range(sen.start, sen.end):
                    sentence[t - first_token] = sentence_base + s
            sentence_base += len(par.sentences)
        paragraph_base += len(document.paragraphs)
        dom_node, mention = [-1] * count, [-1] * count
        # Smallest DOM node wins: assign larger nodes first so smaller ones overwrite them.
        nodes = [(n, node.span) for n, node in enumerate(example.dom_nodes) if node.span.document == d]
        for n, span in sorted(nodes, key=lambda item: item[1].start - item[1].end):
            for t in token_range(span.start, span.end):
                dom_node[t - first_token] = n
        # Longest mention wins, ties to the earlier candidate: assign in the reverse of that order.
        mentions = [(c, m) for c, cand in enumerate(example.candidates) for m in cand.mentions if m.document == d]
        for c, span in sorted(mentions, key=lambda item: (item[1].end - item[1].start, -item[0])):
            for t in token_range(span.start, span.end):
                mention[t - first_token] = c
        for t in range(count):
            region = (d, paragraph[t]) if paragraph[t] >= 0 else (d, "gap", _gap_index(document, starts[t]))
            if region != previous_region:
                segment, previous_region = segment + 1, region
            out.segment.append(segment)
        out.paragraph.extend(paragraph), out.sentence.extend(sentence)
        out.dom_node.extend(dom_node), out.mention.extend(mention)
    return out


def _trimmed(text: str, start: int, end: int) -> list[int]:
    """Offsets without the whitespace a token may carry (byte-level BPE's leading space), unless the
    token is only whitespace; so an answer span maps back without stray spaces."""
    stripped_start, stripped_end = start, end
    while stripped_start < stripped_end and text[stripped_start].isspace():
        stripped_start += 1
    while stripped_end > stripped_start and text[stripped_end - 1].isspace():
        stripped_end -= 1
    return [stripped_start, stripped_end] if stripped_start < stripped_end else [start, end]


def _structure_spans(example: StructuredExample, d: int) -> list[tuple[int, int]]:
    """Every boundary the tokenizer must not cross in document d."""
    spans = []
    for paragraph in example.documents[d].paragraphs:
        spans.append((paragraph.span.start, paragraph.span.end))
        if paragraph.title is not None:
            spans.append((paragraph.title.start, paragraph.title.end))
        spans.extend((s.start, s.end) for s in paragraph.sentences)
    spans.extend((n.span.start, n.span.end) for n in example.dom_nodes if n.span.document == d)
    spans.extend((m.start, m.end) for c in example.candidates for m in c.mentions if m.document == d)
    return spans


def _gap_index(document, char: int) -> int:
    """How many paragraphs start before `char`: tells the gaps between paragraphs apart."""
    return sum(p.span.start <= char for p in document.paragraphs)


def _check_dom_features(example: StructuredExample, size: int) -> None:
    for n, node in enumerate(example.dom_nodes):
        if len(node.features) != size:
            raise InputError(
                f"example {example.id!r}: field 'dom_nodes[{n}].features' has {len(node.features)} values, "
                f"expected global_feature_size={size}"
            )


def _additional_special_tokens(tokenizer) -> list[str]:
    tokens = getattr(tokenizer, "additional_special_tokens", None) or []
    return [t for t in tokens if isinstance(t, str)]


def _cls_id(tokenizer) -> int:
    token_id = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    if token_id is None:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} has neither a cls nor a bos token")
    return token_id


def _sep_id(tokenizer) -> int:
    token_id = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    if token_id is None:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} has neither a sep nor an eos token")
    return token_id
