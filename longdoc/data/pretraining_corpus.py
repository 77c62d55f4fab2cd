"""The corpus of continued pretraining: reading, sentences, packing, and the masking of each batch.

The model and its losses are `longdoc.model.pretraining`, the job `longdoc.train.pretraining`.
Whole-word masking and the 80/10/10 replacement are from Google's BERT repository (README, "Whole
Word Masking"); the CPC sentences are ETC's (Ainslie et al., 2020, arXiv:2004.08483, section 3.3).

1. `read_corpus`: plain-text files (one document per file, or one per line), a folder of them, or a
   `datasets` dataset saved with `save_to_disk` (a "text" column). Files that are not text (NUL
   bytes) and empty documents are skipped and counted.
2. `prepare_corpus`: `Dataset.map(num_proc=...)`, cached by datasets' fingerprints: documents are
   split into sentences (longdoc.data.text), each sentence tokenised with its word starts (for
   whole-word masking); documents with fewer than `min_sentences` sentences are skipped and counted;
   the rest are packed into long inputs of at most `long_length` tokens and `global_max_len`
   sentences, one document per input (a long document fills several).
3. `PretrainingCollator`: per batch, picks the CPC sentences and replaces all their long tokens by
   [MASK] (their global tokens keep the sentence id, or take the model's `cpc_mask` global token
   id where its config names one, as ETC's pretraining did), then whole-word masks `mask_rate` of
   the other tokens (80% [MASK], 10% a random token, 10% unchanged), and builds the second-pass inputs: each CPC
   sentence alone, unmasked, with one global token.
"""

import os
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor

from longdoc.data.batching import collate_features
from longdoc.data.features import GlobalMarkers, TokenTypes
from longdoc.data.text import split_paragraphs, split_sentences
from longdoc.errors import InputError, OptionError
from longdoc.io import decode_text
from longdoc.model.config import GlobalLocalConfig
from longdoc.model.inputs import check_encoder_inputs

# A file whose first bytes hold a NUL is binary (git, grep and file(1) use the same test).
_SNIFF_BYTES = 8192


@dataclass(frozen=True)
class PretrainingSettings:
    """How a corpus becomes pretraining inputs and how each batch is masked.

    `long_length`, `global_max_len`: the most long tokens and sentences (global tokens) per input.
    `max_sentence_tokens`: longer sentences are cut into pieces of at most this many tokens
    (and at most long_length; at word starts where possible), each piece a sentence with its own global token.
    `min_sentences`: documents with fewer sentences are skipped (CPC needs a sentence to mask and
    others to predict it from). `mask_rate`: share of the (non-CPC) tokens chosen for MLM, whole
    words at a time. `cpc_sentence_rate`: share of each input's sentences masked for CPC (at least
    one, never all).
    """

    long_length: int = 4096
    global_max_len: int = 256
    max_sentence_tokens: int = 128
    min_sentences: int = 2
    mask_rate: float = 0.15
    cpc_sentence_rate: float = 0.1

    def __post_init__(self):
        def require(condition: bool, template: str, got) -> None:
            if not condition:
                raise OptionError("pretraining settings: " + template, got=got)

        # Named by the options that set them (the lengths come from the encoder's: long_max_len).
        require(self.long_length >= 2, "{long_max_len} must be >= 2, got {got}", self.long_length)
        require(self.global_max_len >= 2, "{global_max_len} must be >= 2, got {got}", self.global_max_len)
        require(self.max_sentence_tokens >= 1, "{max_sentence_tokens} must be >= 1, got {got}",
                self.max_sentence_tokens)
        require(self.min_sentences >= 1, "{min_sentences} must be >= 1, got {got}", self.min_sentences)
        require(0.0 < self.mask_rate < 1.0, "{mask_rate} must be in (0, 1), got {got}", self.mask_rate)
        require(0.0 <= self.cpc_sentence_rate < 1.0, "{cpc_sentence_rate} must be in [0, 1), got {got}",
                self.cpc_sentence_rate)


# ----------------------------------------------------------------------------------------------
# 1. Reading the corpus


@dataclass
class CorpusReport:
    """What reading and preparing a corpus kept and skipped (all counts)."""

    files: int = 0
    not_text_files: int = 0
    documents: int = 0
    empty_documents: int = 0
    short_documents: int = 0
    kept_documents: int = 0
    sentences: int = 0
    tokens: int = 0
    inputs: int = 0

    def skipped_text(self, min_sentences: int) -> str:
        parts = []
        if self.not_text_files:
            parts.append(f"{self.not_text_files} file(s) not text (binary)")
        if self.empty_documents:
            parts.append(f"{self.empty_documents} empty document(s)")
        if self.short_documents:
            parts.append(f"{self.short_documents} document(s) with fewer than {min_sentences} sentence(s)")
        return "; ".join(parts) or "nothing"


def _text_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        # Hidden files and folders (.git, editor backups) are not part of a corpus.
        return sorted(p for p in path.rglob("*") if p.is_file()
                      and not any(part.startswith(".") for part in p.relative_to(path).parts))
    raise InputError(f"{path}: no such file or folder")


def _is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and ((path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file())


def _file_documents(files: Sequence[str], one_per_line: bool, stamps: Sequence[str]) -> Iterator[dict]:
    # `stamps` (path:size:mtime of each file) is unused here on purpose: it is part of the
    # generator's fingerprint, so an edited corpus is read again.
    for name in files:
        data = Path(name).read_bytes()
        if b"\0" in data[:_SNIFF_BYTES]:
            yield {"text": "", "file": name, "binary": True}
            continue
        text = decode_text(data, name)
        for document in (text.splitlines() if one_per_line else [text]):
            yield {"text": document, "file": name, "binary": False}


def read_corpus(path: str | os.PathLike, one_per_line: bool = False, cache_dir: str | os.PathLike | None = None):
    """The documents of `path` as a `datasets.Dataset` with columns text, file, binary (one row per
    document; a binary file is one row with binary=True). Cached: the fingerprint covers each
    file's path, size and modification time, so an edited corpus is read again."""
    from datasets import Dataset, DatasetDict, load_from_disk

    path = Path(path)
    if _is_saved_dataset(path):
        loaded = load_from_disk(str(path))
        if isinstance(loaded, DatasetDict):
            if "train" not in loaded:
                raise InputError(f"{path}: a dataset dict without a 'train' split (has {', '.join(loaded)})")
            loaded = loaded["train"]
        if "text" not in loaded.column_names:
            raise InputError(f"{path}: the saved dataset has no 'text' column (has {', '.join(loaded.column_names)})")
        return loaded.select_columns(["text"]).map(
            lambda row: {"file": str(path), "binary": False}, desc="corpus")
    files = _text_files(path)
    if not files:
        raise InputError(f"{path}: the folder holds no files")
    stamps = [f"{f}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files]
    return Dataset.from_generator(
        _file_documents,
        gen_kwargs={"files": [str(f) for f in files], "one_per_line": one_per_line, "stamps": stamps},
        cache_dir=None if cache_dir is None else str(cache_dir),
    )


# ----------------------------------------------------------------------------------------------
# 2. Sentences, tokens, packing


def _sentences_of(text: str) -> list[str]:
    return [text[start:end] for p_start, p_end in split_paragraphs(text)
            for start, end in split_sentences(text, p_start, p_end)]


def _cut_sentence(ids: list[int], starts: list[int], limit: int) -> list[tuple[list[int], list[int]]]:
    """Pieces of at most `limit` tokens, each cut before a word start where one is in reach."""
    pieces, begin = [], 0
    while len(ids) - begin > limit:
        cut = next((c for c in range(begin + limit, begin, -1) if starts[c]), begin + limit)
        pieces.append((ids[begin:cut], starts[begin:cut]))
        begin = cut
    pieces.append((ids[begin:], starts[begin:]))
    return pieces


def _tokenize_documents(batch: dict, tokenizer, settings: PretrainingSettings) -> dict:
    sentence_ids, sentence_starts = [], []
    for text in batch["text"]:
        sentences = _sentences_of(text)
        encoded = tokenizer(sentences, add_special_tokens=False, verbose=False) if sentences else None
        doc_ids, doc_starts = [], []
        for index in range(len(sentences)):
            ids = encoded["input_ids"][index]
            if not ids:
                continue
            words = encoded.word_ids(index)
            starts = [int(i == 0 or w is None or w != words[i - 1]) for i, w in enumerate(words)]
            for piece_ids, piece_starts in _cut_sentence(
                    ids, starts, min(settings.max_sentence_tokens, settings.long_length)):
                doc_ids.append(piece_ids)
                doc_starts.append(piece_starts)
        sentence_ids.append(doc_ids)
        sentence_starts.append(doc_starts)
    return {"sentences": sentence_ids, "word_starts": sentence_starts,
            "num_sentences": [len(s) for s in sentence_ids]}


def _pack_documents(batch: dict, settings: PretrainingSettings) -> dict:
    """One document's sentences, in order, into inputs of at most long_length tokens and global_max_len sentences."""
    rows = {"long_input_ids": [], "word_starts": [], "sentence_ids": [], "num_sentences": [], "num_tokens": []}

    def emit(ids, starts, owners):
        rows["num_tokens"].append(len(ids))
        rows["long_input_ids"].append(ids)
        rows["word_starts"].append(starts)
        rows["sentence_ids"].append(owners)
        rows["num_sentences"].append(owners[-1] + 1)

    for sentences, word_starts in zip(batch["sentences"], batch["word_starts"]):
        ids, starts, owners = [], [], []
        for sentence, sentence_starts in zip(sentences, word_starts):
            count = owners[-1] + 1 if owners else 0
            if ids and (len(ids) + len(sentence) > settings.long_length or count == settings.global_max_len):
                emit(ids, starts, owners)
                ids, starts, owners, count = [], [], [], 0
            ids.extend(sentence)
            starts.extend(sentence_starts)
            owners.extend([count] * len(sentence))
        if ids:
            emit(ids, starts, owners)
    return rows


def prepare_corpus(documents, tokenizer, settings: PretrainingSettings, num_proc: int | None = None):
    """(inputs dataset, CorpusReport). Inputs have columns long_input_ids, word_starts, sentence_ids,
    num_sentences, num_tokens. InputError when nothing is left to train on, with counts of what was skipped."""
    if not getattr(tokenizer, "is_fast", False):
        raise InputError(f"pretraining needs a fast tokenizer (word boundaries for whole-word masking); "
                         f"got {type(tokenizer).__name__}")
    report = CorpusReport()
    binary = documents["binary"]
    report.files = len(set(documents["file"]))
    report.not_text_files = sum(binary)
    report.documents = len(binary) - report.not_text_files
    text_rows = documents.filter(lambda row: not row["binary"], desc="text files", num_proc=num_proc)
    if len(text_rows) == 0:
        raise InputError(f"the corpus holds no text to train on: {report.files} file(s) read; skipped "
                         f"{report.skipped_text(settings.min_sentences)}")
    tokenized = text_rows.map(
        _tokenize_documents, batched=True, batch_size=64, num_proc=num_proc,
        remove_columns=text_rows.column_names, fn_kwargs={"tokenizer": tokenizer, "settings": settings},
        desc="sentences",
    )
    counts = Counter(tokenized["num_sentences"])
    report.empty_documents = counts.get(0, 0)
    report.short_documents = sum(c for n, c in counts.items() if 0 < n < settings.min_sentences)
    kept = tokenized.filter(lambda row: row["num_sentences"] >= settings.min_sentences, num_proc=num_proc,
                            desc="documents")
    report.kept_documents = len(kept)
    if report.kept_documents == 0:
        raise InputError(f"no document to train on: {report.documents} document(s) in {report.files} file(s), "
                         f"all skipped ({report.skipped_text(settings.min_sentences)})")
    inputs = kept.map(
        _pack_documents, batched=True, batch_size=64, num_proc=num_proc, remove_columns=kept.column_names,
        fn_kwargs={"settings": settings}, desc="packing",
    )
    report.inputs = len(inputs)
    report.sentences = sum(inputs["num_sentences"])
    report.tokens = sum(inputs["num_tokens"])
    if report.empty_documents or report.short_documents or report.not_text_files:
        warnings.warn(f"pretraining corpus: skipped {report.skipped_text(settings.min_sentences)}; "
                      f"kept {report.kept_documents} of {report.documents} document(s)", stacklevel=2)
    return inputs, report


# ----------------------------------------------------------------------------------------------
# 3. Masking a batch


def cpc_sentence_count(num_sentences: int, rate: float) -> int:
    """How many of an input's sentences are masked for CPC: `rate` of them, at least one, never all
    (none when the input has fewer than 2 sentences or the rate is 0)."""
    if num_sentences < 2 or rate == 0:
        return 0
    return min(num_sentences - 1, max(1, round(rate * num_sentences)))


class PretrainingCollator:
    """Rows of `prepare_corpus` -> a batch for `longdoc.model.pretraining.GlobalLocalForPretraining.forward`.

    Random choices draw from torch's global generator, so a run seeded (and resumed with its RNG
    state) masks the same way. `config`: the model's, whose input conventions (global token ids,
    token types) the inputs follow, and against which the CPC sentences' inputs (the second pass,
    `cpc_*`) are checked here, where they are made (the training engine checks the first pass's);
    None: longdoc's defaults with the tokenizer's markers, unchecked.
    """

    def __init__(self, tokenizer, settings: PretrainingSettings, config: GlobalLocalConfig | None = None):
        self.settings = settings
        self.pad_id = tokenizer.pad_token_id
        self.mask_id = tokenizer.mask_token_id
        if self.mask_id is None or self.pad_id is None:
            raise InputError(f"pretraining needs a tokenizer with a mask and a pad token; "
                             f"{type(tokenizer).__name__} lacks one")
        self.markers = (None if config is None else GlobalMarkers.from_config(config)) or GlobalMarkers.from_tokenizer(
            tokenizer)
        self.token_types = TokenTypes() if config is None else TokenTypes.from_config(config)
        self.config = config
        self.vocab_size = len(tokenizer)
        # Random replacements avoid special tokens ([CLS], [SEP], [PAD], [MASK], markers).
        special = set(tokenizer.all_special_ids)
        self.replacement_ids = torch.tensor([i for i in range(self.vocab_size) if i not in special])

    def __call__(self, rows: Sequence[dict[str, Any]]) -> dict[str, Tensor]:
        model_rows, labels, cpc_pairs, cpc_sentences = [], [], [], []
        for b, row in enumerate(rows):
            ids = torch.as_tensor(row["long_input_ids"], dtype=torch.long)
            owners = torch.as_tensor(row["sentence_ids"], dtype=torch.long)
            starts = torch.as_tensor(row["word_starts"], dtype=torch.bool)
            count = int(row["num_sentences"])
            masked_ids, row_labels = ids.clone(), torch.full_like(ids, -100)
            cpc_mask = torch.zeros_like(ids, dtype=torch.bool)
            chosen = self._cpc_sentences(count)
            for sentence in chosen:
                here = owners == sentence
                cpc_sentences.append(ids[here])
                cpc_pairs.append((b, sentence))
                cpc_mask |= here
            masked_ids[cpc_mask] = self.mask_id
            self._mask_words(ids, masked_ids, row_labels, starts, cpc_mask)
            labels.append(row_labels)
            model_rows.append(self.sentences_row(masked_ids, owners, count, chosen))
        batch = collate_features(model_rows, self.pad_id)
        batch["mlm_labels"] = torch.nn.utils.rnn.pad_sequence(labels, batch_first=True, padding_value=-100)
        batch["cpc_positions"] = torch.tensor(cpc_pairs, dtype=torch.long).reshape(-1, 2)
        sentence_rows = [self.sentences_row(sentence, torch.zeros_like(sentence), 1) for sentence in cpc_sentences]
        if sentence_rows:
            sentences = collate_features(sentence_rows, self.pad_id)
            if self.config is not None:
                check_encoder_inputs(sentences, self.config)
            for name, value in sentences.items():
                batch[f"cpc_{name}"] = value
        return batch

    def sentences_row(self, ids: Tensor, owners: Tensor, count: int,
                      cpc_sentences: Sequence[int] = ()) -> dict[str, Tensor]:
        """Encoder inputs (named as in `longdoc.model.inputs.ENCODER_INPUTS`) of `count` sentences:
        long tokens `ids`, each linked to its sentence's global token by `owners` (hard g2l), one
        sentence-marker global token per sentence (the cpc_mask marker, where the model has one, for
        `cpc_sentences`); long tokens take the document token type, global tokens the structure one,
        as fine-tuning gives them."""
        global_ids = torch.full((count,), self.markers.sentence)
        if self.markers.cpc_mask is not None and len(cpc_sentences):
            global_ids[list(cpc_sentences)] = self.markers.cpc_mask
        return {
            "long_input_ids": ids,
            "long_attention_mask": torch.ones_like(ids),
            "long_token_type_ids": torch.full_like(ids, self.token_types.long_document),
            "sentence_ids": owners,
            "global_input_ids": global_ids,
            "global_attention_mask": torch.ones(count, dtype=torch.long),
            "global_token_type_ids": torch.full((count,), self.token_types.global_structure),
        }

    def _cpc_sentences(self, count: int) -> list[int]:
        chosen = cpc_sentence_count(count, self.settings.cpc_sentence_rate)
        return sorted(torch.randperm(count)[:chosen].tolist()) if chosen else []

    def _mask_words(self, ids: Tensor, masked_ids: Tensor, labels: Tensor, starts: Tensor, excluded: Tensor) -> None:
        """Whole-word masking of about mask_rate of the tokens outside `excluded`, in place."""
        word_index = torch.cumsum(starts.long(), 0) - 1
        word_index[word_index < 0] = 0  # a row starting inside a word (a cut sentence): one word
        num_words = int(word_index[-1]) + 1
        eligible = torch.ones(num_words, dtype=torch.bool)
        eligible[word_index[excluded]] = False
        candidates = eligible.nonzero().flatten()
        budget = max(1, round(self.settings.mask_rate * int((~excluded).sum())))
        if len(candidates) == 0:
            return
        order = candidates[torch.randperm(len(candidates))]
        word_sizes = torch.bincount(word_index, minlength=num_words)
        # Words in random order until the token budget is spent (BERT's whole-word masking).
        within = torch.cumsum(word_sizes[order], 0) <= budget
        within[0] = True
        chosen_words = order[within]
        # 80% [MASK], 10% a random token, 10% unchanged, decided per word.
        draw = torch.rand(len(chosen_words))
        word_action = torch.zeros(num_words, dtype=torch.long)  # 0: not chosen
        word_action[chosen_words] = torch.where(draw < 0.8, 1, torch.where(draw < 0.9, 2, 3))
        action = word_action[word_index]
        action[excluded] = 0
        labels[action > 0] = ids[action > 0]
        masked_ids[action == 1] = self.mask_id
        random_positions = (action == 2).nonzero().flatten()
        picks = torch.randint(len(self.replacement_ids), (len(random_positions),))
        masked_ids[random_positions] = self.replacement_ids[picks]
