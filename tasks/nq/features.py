"""Natural Questions examples -> training rows and batches: ETC's NQ construction (Ainslie et al.,
2020, arXiv:2004.08483, section 4).

Long input per window: `[CLS] question [SEP] window of the document [SEP]`, sliding windows over
the document that overlap by `stride` wordpieces; global input: CLS, one token per question
wordpiece, one per top-level long-answer candidate in the window (the reader makes each such
candidate a paragraph; `longdoc.data.features.build_features` lays them out and links each
candidate's tokens to its global token). ETC: Ainslie et al., 2020, section 4;
google-research/google-research etcmodel/models/nq/preproc_nq_lib.py.

HTML tag tokens ("<P>", "</Table>", `<Td_colspan="2">`) are markers: `HtmlMarkerTokenizer` turns
each into one wordpiece, a vocabulary entry BERT leaves unused ([unused4] onwards; one per common
tag name, opening or closing, one more for other tags), as the BERT-joint baseline's NQ vocabulary
does (Alberti et al., 2019, arXiv:1901.08634), instead of three or more pieces of "<", "p", ">".

Labels per window (BERT-joint's recipe, as ETC's): the gold answer is the first annotation with a
long answer (training files have one annotation). When that long answer lies whole in the window:
answer type YES / NO (long span as the long target, the short target at [CLS]), SHORT (long and
short targets; the short target runs from the first short answer's start to the last one's end),
or LONG (the short target at [CLS]); a gold long answer that is a nested candidate stays the
target as annotated, though decoding proposes top-level candidates only (ETC's construction).
Otherwise the window is NULL and every target points at [CLS] (long token 0), so the heads learn
a "no answer here" score at [CLS] that decoding subtracts to make scores comparable across
windows (`longdoc.tasks.nq.decode`). In training, NULL
windows are kept with probability `null_window_keep_rate` (a deterministic draw from the example
id and window index, so a rerun, or another process count, keeps the same windows).

Row keys beside the model inputs: `answer_mask` [L] (1 where a span may start or end: [CLS] and
document tokens), and with labels `answer_type` (`ANSWER_TYPES`), `long_start_positions`,
`long_end_positions`, `short_start_positions`, `short_end_positions` (long-token indices).
"""

import bisect
import multiprocessing
import re
import warnings
import zlib
from itertools import islice
from typing import Any, Iterator, Sequence

import torch
from tqdm.auto import tqdm

from longdoc.data.batching import collate_features
from longdoc.data.examples import StructuredExample, TextSpan
from longdoc.data.features import FeatureSettings, Features, GlobalMarkers, build_features, window_settings
from longdoc.data.spans import char_span_to_token_span
from longdoc.errors import OptionError
from longdoc.model.inputs import InputSpec
from longdoc.tasks.nq import NQOptions
from longdoc.tasks.nq.reader import read_examples, token_char_spans

ANSWER_TYPES = ("null", "yes", "no", "long", "short")
NULL, YES, NO, LONG, SHORT = range(len(ANSWER_TYPES))
ROW_SPECS = (
    InputSpec("answer_mask", ("batch", "long"), torch.bool, pad=False),
    InputSpec("answer_type", ("batch",), torch.long),
    InputSpec("long_start_positions", ("batch",), torch.long),
    InputSpec("long_end_positions", ("batch",), torch.long),
    InputSpec("short_start_positions", ("batch",), torch.long),
    InputSpec("short_end_positions", ("batch",), torch.long),
)
# Examples handed to a worker process at once when building features with num_proc > 1; at most
# num_proc chunks are in flight, so memory stays bounded however long the file is.
CHUNK_EXAMPLES = 16

# A tag token as simplify_nq_example writes it: "<" name, no blank inside, ">" (a lone "<" is text).
HTML_TAG = re.compile(r"(?<!\S)</?[A-Za-z][^<>\s]*>(?!\S)")
TAG_NAMES = ("p", "table", "tr", "td", "th", "ul", "ol", "dl", "li", "dd", "dt", "h1", "h2", "h3", "h4", "h5", "h6")
FIRST_MARKER = 4  # [unused0..3] are the global-token markers (GlobalMarkers)


class HtmlMarkerTokenizer:
    """A tokenizer whose calls give every HTML tag token one marker wordpiece (see the module docstring).

    Called like a transformers tokenizer with `return_offsets_mapping=True` (one string or a list),
    as `build_features` calls it; every other attribute is the wrapped tokenizer's. Without
    [unusedN] entries in the vocabulary (BPE vocabularies), tags are tokenized as text, with a warning.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        vocab = tokenizer.get_vocab()
        names = [f"<{name}>" for name in TAG_NAMES] + [f"</{name}>" for name in TAG_NAMES] + ["<other>", "</other>"]
        ids = [vocab.get(f"[unused{FIRST_MARKER + i}]") for i in range(len(names))]
        self.marker_ids = dict(zip(names, ids)) if all(i is not None for i in ids) else None
        if self.marker_ids is None:
            warnings.warn(f"tokenizer {type(tokenizer).__name__} has no [unused{FIRST_MARKER}..] entries: NQ HTML tags "
                          "are tokenized as text", stacklevel=2)

    def __getattr__(self, name):
        # Only reached for attributes not set in __init__ (and never for "tokenizer" itself once
        # set, so unpickling, which starts from an empty instance, does not recurse).
        if name == "tokenizer":
            raise AttributeError(name)
        return getattr(self.tokenizer, name)

    def marker_id(self, tag: str) -> int:
        closing = tag.startswith("</")
        name = tag[2 if closing else 1:-1].split("_", 1)[0].lower()
        if name not in TAG_NAMES:
            name = "other"
        return self.marker_ids[f"</{name}>" if closing else f"<{name}>"]

    def __call__(self, text, **kwargs):
        if self.marker_ids is None:
            return self.tokenizer(text, **kwargs)
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        # Cut every text into runs of plain text and single tags; tokenize all plain runs in one call.
        parts = []  # per text: list of (start, end, tag marker id or None)
        plain = []
        for piece in texts:
            cuts, position = [], 0
            for match in HTML_TAG.finditer(piece):
                if match.start() > position:
                    cuts.append((position, match.start(), None))
                cuts.append((match.start(), match.end(), self.marker_id(match.group())))
                position = match.end()
            if position < len(piece):
                cuts.append((position, len(piece), None))
            parts.append(cuts)
            plain.extend(piece[a:b] for a, b, marker in cuts if marker is None)
        encoded = self.tokenizer(plain, add_special_tokens=False, return_offsets_mapping=True, verbose=False) \
            if plain else {"input_ids": [], "offset_mapping": []}
        plain_results = iter(zip(encoded["input_ids"], encoded["offset_mapping"]))
        all_ids, all_offsets = [], []
        for cuts in parts:
            ids, offsets = [], []
            for a, b, marker in cuts:
                if marker is not None:
                    ids.append(marker), offsets.append((a, b))
                    continue
                piece_ids, piece_offsets = next(plain_results)
                ids.extend(piece_ids)
                offsets.extend((a + s, a + e) for s, e in piece_offsets)
            all_ids.append(ids), all_offsets.append(offsets)
        if single:
            return {"input_ids": all_ids[0], "offset_mapping": all_offsets[0]}
        return {"input_ids": all_ids, "offset_mapping": all_offsets}


def feature_settings(config) -> FeatureSettings:
    """The window settings of a model config (a GlobalLocalConfig with the task's `task_options`)."""
    return window_settings("nq", config, ("stride", "max_question_len"))


def window_inputs(features: Features) -> dict[str, Any]:
    """The model inputs of one window plus the answer mask ([CLS] and document tokens)."""
    row = features.model_inputs()
    row["answer_mask"] = [index == 0 or source == 0 for index, source in enumerate(features.long_source_ids)]
    return row


def gold_answer(example: StructuredExample) -> dict[str, Any] | None:
    """The training target: {"long": TextSpan, "short": TextSpan | None, "yes_no": "YES"/"NO"/"NONE"}
    from the first annotation with a long answer; None when no annotator gave one."""
    annotations = example.labels.get("annotations") or []
    chosen = next((a for a in annotations if a.get("long_answer", {}).get("start_token", -1) >= 0), None)
    if chosen is None:
        return None
    tokens = token_char_spans(example.documents[0].text)

    def chars(first_token: int, end_token: int) -> TextSpan:
        return TextSpan(0, tokens[first_token][0], tokens[end_token - 1][1])

    long_answer = chosen["long_answer"]
    shorts = [s for s in chosen.get("short_answers", []) if s["end_token"] > s["start_token"]]
    short = chars(min(s["start_token"] for s in shorts), max(s["end_token"] for s in shorts)) if shorts else None
    return {"long": chars(long_answer["start_token"], long_answer["end_token"]), "short": short,
            "yes_no": str(chosen.get("yes_no_answer", "NONE")).upper()}


def window_row(features: Features, gold: dict[str, Any] | None) -> dict[str, Any]:
    """One labelled row: `window_inputs` plus answer type and the four span targets."""
    row = window_inputs(features)
    long_tokens = None if gold is None else char_span_to_token_span(features.long_offsets, features.long_source_ids,
                                                                     gold["long"])
    targets = {"answer_type": NULL, "long_start_positions": 0, "long_end_positions": 0,
               "short_start_positions": 0, "short_end_positions": 0}
    if long_tokens is not None:
        targets["long_start_positions"], targets["long_end_positions"] = long_tokens.first, long_tokens.last
        short_tokens = None if gold["short"] is None else char_span_to_token_span(
            features.long_offsets, features.long_source_ids, gold["short"])
        if gold["yes_no"] in ("YES", "NO"):
            targets["answer_type"] = YES if gold["yes_no"] == "YES" else NO
        elif short_tokens is not None:
            targets["answer_type"] = SHORT
            targets["short_start_positions"], targets["short_end_positions"] = short_tokens.first, short_tokens.last
        else:
            targets["answer_type"] = LONG
    row.update(targets)
    return row


def keeps_null_window(example_id: str, window_index: int, rate: float) -> bool:
    """Whether a NULL window is kept: a fixed draw in [0, 1) from the example id and window index."""
    if rate >= 1:
        return True
    draw = zlib.crc32(f"{example_id}:{window_index}".encode()) / 2**32
    return draw < rate


def example_rows(example: StructuredExample, tokenizer, settings: FeatureSettings, markers: GlobalMarkers,
                 null_window_keep_rate: float) -> list[dict[str, Any]]:
    """The kept training rows of one example."""
    gold = gold_answer(example)
    rows = []
    for features in build_features(example, tokenizer, settings, markers):
        row = window_row(features, gold)
        if row["answer_type"] != NULL or keeps_null_window(example.id, features.window_index, null_window_keep_rate):
            rows.append(row)
    return rows


_worker_state: dict[str, Any] = {}


def _init_worker(tokenizer, settings, markers, rate) -> None:
    _worker_state.update(tokenizer=tokenizer, settings=settings, markers=markers, rate=rate)


def _rows_of_chunk(examples: list[StructuredExample]) -> list[list[dict[str, Any]]]:
    state = _worker_state
    return [example_rows(e, state["tokenizer"], state["settings"], state["markers"], state["rate"]) for e in examples]


def iter_training_rows(path, tokenizer, config, options: NQOptions | None = None, num_proc: int = 1,
                       progress: bool = True) -> Iterator[list[dict[str, Any]]]:
    """The kept rows of each example of the NQ file `path`, one list per example, in file order.

    Streaming: examples are read as they are needed. Every window with an answer is kept, and a
    fixed share of those without (`options.null_window_keep_rate`, `keeps_null_window`).

    Args:
        path: the NQ file, in either official format (JSON lines, gzipped or not).
        tokenizer: the model's tokenizer (wrapped so that HTML markers stay whole).
        config: the encoder's config (lengths and input conventions of the features).
        options: the run's NQ options; None: the defaults.
        num_proc: worker processes that build features for chunks of CHUNK_EXAMPLES examples, with
            at most `num_proc` chunks in flight; 1 or less: in this process.
        progress: show a progress bar over the examples.

    Yields:
        One list of training rows per example, in file order.

    Raises:
        OptionError: `options.null_window_keep_rate` outside [0, 1].
        InputError: a line of the file that does not parse, naming the file and line (unless
            `options.skip_bad_lines`).
    """
    options = options or NQOptions()
    settings = feature_settings(config)
    wrapped = HtmlMarkerTokenizer(tokenizer)
    markers = GlobalMarkers.from_tokenizer(tokenizer)
    rate = float(options.null_window_keep_rate)
    if not 0 <= rate <= 1:
        raise OptionError("{null_window_keep_rate} must be in [0, 1], got {rate}", rate=rate)
    examples = read_examples(path, skip_bad_lines=options.skip_bad_lines)
    bar = tqdm(desc=f"features {path}", unit=" examples", disable=not progress)
    with bar:
        if num_proc <= 1:
            for example in examples:
                yield example_rows(example, wrapped, settings, markers, rate)
                bar.update(1)
            return
        # fork starts workers in milliseconds (spawn re-imports torch in each: seconds); the
        # workers only tokenize, so the parent's threads do not matter to them.
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        with context.Pool(num_proc, initializer=_init_worker, initargs=(wrapped, settings, markers, rate)) as pool:
            pending = []
            while True:
                while len(pending) < num_proc:
                    chunk = list(islice(examples, CHUNK_EXAMPLES))
                    if not chunk:
                        break
                    pending.append(pool.apply_async(_rows_of_chunk, (chunk,)))
                if not pending:
                    return
                for rows in pending.pop(0).get():
                    yield rows
                    bar.update(1)


def training_features(path, tokenizer, config, options: NQOptions | None = None,
                      progress: bool = True) -> list[dict[str, Any]]:
    """Every kept window of every example in the NQ file `path`, as labelled rows."""
    rows = []
    for example_rows_ in iter_training_rows(path, tokenizer, config, options, progress=progress):
        rows.extend(example_rows_)
    return rows


def collate(rows: Sequence[dict[str, Any]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """A padded batch of rows (labelled or not) that goes straight into `NQModel(**batch)`."""
    return collate_features(rows, pad_token_id, extra=ROW_SPECS)


def document_token_index(document_text: str):
    """A function from a character offset to the index of the document token that holds it."""
    starts = [start for start, _ in token_char_spans(document_text)]
    return lambda char: bisect.bisect_right(starts, char) - 1
