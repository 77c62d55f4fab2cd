"""Continued pretraining of a global-local encoder: whole-word masked LM plus CPC over sentence globals.

References: ETC (Ainslie et al., 2020, arXiv:2004.08483, section 3.3 and appendix) pretrains with
masked language modelling and Contrastive Predictive Coding over the sentence global tokens, one
global token per sentence with hard g2l; CPC and its InfoNCE loss are from van den Oord et al.
(2018, arXiv:1807.03748); whole-word masking and the 80/10/10 replacement from Google's BERT
repository (README, "Whole Word Masking"); RealFormer (He et al., 2020) keeps residual attention
on during pretraining, as the encoder's config does by default.

The pipeline:
1. `read_corpus`: plain-text files (one document per file, or one per line), a folder of them, or a
   `datasets` dataset saved with `save_to_disk` (a "text" column). Files that are not text (NUL
   bytes) and empty documents are skipped and counted.
2. `prepare_corpus`: `Dataset.map(num_proc=...)`, cached by datasets' fingerprints: documents are
   split into sentences (longdoc.data.text), each sentence tokenised with its word starts (for
   whole-word masking); documents with fewer than `min_sentences` sentences are skipped and counted;
   the rest are packed into long inputs of at most `long_length` tokens and `global_max_len`
   sentences, one document per input (a long document fills several).
3. `PretrainingCollator`: per batch, picks the CPC sentences and replaces all their long tokens by
   [MASK] (their global tokens stay), then whole-word masks `mask_rate` of the other tokens
   (80% [MASK], 10% a random token, 10% unchanged), and builds the second-pass inputs: each CPC
   sentence alone, unmasked, with one global token.
4. `GlobalLocalForPretraining`: encoder + MLM head (transform, decoder tied to the word embeddings)
   + CPC projection; `forward(**batch)` returns the total loss and each part.

CPC as chosen here. ETC trains "the hidden representation of the global sentence summary tokens
for the masked sentences" to be close to "that of a global summary token that can see the unmasked
sentence and nothing else", with an NCE loss. We take that literally: the target encoding of a
masked sentence is the output of a sentence global token in a second pass of the same encoder
over that sentence alone (its unmasked tokens plus its one global token: under hard g2l it sees
exactly the sentence). The prediction is the masked sentence's global output in the main pass
through a learnt linear projection (CPC's W_k, starting at the identity); the score of a
(prediction, target) pair is their cosine similarity over a temperature of 0.1; the negatives are
the other CPC sentences of the batch (in-batch, InfoNCE). Gradients flow into both passes: the second pass teaches the global token to summarise
its sentence, which is what fine-tuning's sentence globals need. A mean of long outputs was not
chosen because it trains no global token; a fixed projection of the embeddings would not train
the summary at all.
"""

import os
import sys
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.utils import ModelOutput

from longdoc.convert.checkpoint import readable_weights
from longdoc.data.batching import collate_features
from longdoc.data.features import GlobalMarkers
from longdoc.data.text import decode_text, split_paragraphs, split_sentences
from longdoc.errors import InputError
from longdoc.model.config import GlobalLocalConfig
from longdoc.model.inputs import encoder_inputs
from longdoc.model.modeling import GlobalLocalModel, GlobalLocalPreTrainedModel

# A file whose first bytes hold a NUL is binary (git, grep and file(1) use the same test).
_SNIFF_BYTES = 8192
# The pretraining heads live beside the encoder's own files, so a later run started from the
# output (`--init`) continues with trained heads; GlobalLocalModel.from_pretrained ignores the file.
HEADS_FILE = "pretraining_heads.safetensors"
# CPC scores are cosine similarities divided by this temperature (SimCLR, Chen et al. 2020,
# arXiv:2002.05709, uses 0.1-0.5): bounded logits whatever the scale of the hidden states.
CPC_TEMPERATURE = 0.1
# BERT's names for its MLM transform and output bias (BertForPreTraining / BertForMaskedLM).
_BERT_MLM_NAMES = {
    "mlm_transform.dense.weight": "cls.predictions.transform.dense.weight",
    "mlm_transform.dense.bias": "cls.predictions.transform.dense.bias",
    "mlm_transform.layer_norm.weight": "cls.predictions.transform.LayerNorm.weight",
    "mlm_transform.layer_norm.bias": "cls.predictions.transform.LayerNorm.bias",
    "mlm_bias": "cls.predictions.bias",
}


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
        def require(condition: bool, message: str) -> None:
            if not condition:
                raise InputError(f"pretraining settings: {message}")

        # Named by the `longdoc pretrain` flags that set them (the lengths come from the encoder's).
        require(self.long_length >= 2, f"--long-max-len must be >= 2, got {self.long_length}")
        require(self.global_max_len >= 2, f"--global-max-len must be >= 2, got {self.global_max_len}")
        require(self.max_sentence_tokens >= 1, f"--max-sentence-tokens must be >= 1, got {self.max_sentence_tokens}")
        require(self.min_sentences >= 1, f"--min-sentences must be >= 1, got {self.min_sentences}")
        require(0.0 < self.mask_rate < 1.0, f"--mask-rate must be in (0, 1), got {self.mask_rate}")
        require(0.0 <= self.cpc_sentence_rate < 1.0,
                f"--cpc-sentence-rate must be in [0, 1), got {self.cpc_sentence_rate}")


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
    raise InputError(f"--train {path}: no such file or folder")


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
                raise InputError(f"--train {path}: a dataset dict without a 'train' split (has {', '.join(loaded)})")
            loaded = loaded["train"]
        if "text" not in loaded.column_names:
            raise InputError(f"--train {path}: the saved dataset has no 'text' column (has {', '.join(loaded.column_names)})")
        return loaded.select_columns(["text"]).map(
            lambda row: {"file": str(path), "binary": False}, desc="corpus")
    files = _text_files(path)
    if not files:
        raise InputError(f"--train {path}: the folder holds no files")
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
    """Rows of `prepare_corpus` -> a batch for `GlobalLocalForPretraining.forward`.

    Random choices draw from torch's global generator, so a run seeded (and resumed with its RNG
    state) masks the same way.
    """

    def __init__(self, tokenizer, settings: PretrainingSettings):
        self.settings = settings
        self.pad_id = tokenizer.pad_token_id
        self.mask_id = tokenizer.mask_token_id
        if self.mask_id is None or self.pad_id is None:
            raise InputError(f"pretraining needs a tokenizer with a mask and a pad token; "
                             f"{type(tokenizer).__name__} lacks one")
        self.sentence_marker = GlobalMarkers.from_tokenizer(tokenizer).sentence
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
            for sentence in self._cpc_sentences(count):
                here = owners == sentence
                cpc_sentences.append(ids[here])
                cpc_pairs.append((b, sentence))
                cpc_mask |= here
            masked_ids[cpc_mask] = self.mask_id
            self._mask_words(ids, masked_ids, row_labels, starts, cpc_mask)
            labels.append(row_labels)
            model_rows.append(self._sentences_row(masked_ids, owners, count))
        batch = collate_features(model_rows, self.pad_id)
        batch["mlm_labels"] = torch.nn.utils.rnn.pad_sequence(labels, batch_first=True, padding_value=-100)
        batch["cpc_positions"] = torch.tensor(cpc_pairs, dtype=torch.long).reshape(-1, 2)
        sentence_rows = [self._sentences_row(sentence, torch.zeros_like(sentence), 1) for sentence in cpc_sentences]
        if sentence_rows:
            for name, value in collate_features(sentence_rows, self.pad_id).items():
                batch[f"cpc_{name}"] = value
        return batch

    def _sentences_row(self, ids: Tensor, owners: Tensor, count: int) -> dict[str, Tensor]:
        """Encoder inputs (named as in `longdoc.model.inputs.ENCODER_INPUTS`) of `count` sentences:
        long tokens `ids`, each linked to its sentence's global token by `owners` (hard g2l), one
        sentence-marker global token per sentence; every token type 1, as fine-tuning gives document tokens."""
        return {
            "long_input_ids": ids,
            "long_attention_mask": torch.ones_like(ids),
            "long_token_type_ids": torch.ones_like(ids),
            "sentence_ids": owners,
            "global_input_ids": torch.full((count,), self.sentence_marker),
            "global_attention_mask": torch.ones(count, dtype=torch.long),
            "global_token_type_ids": torch.ones(count, dtype=torch.long),
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


# ----------------------------------------------------------------------------------------------
# 4. The model


@dataclass
class PretrainingOutput(ModelOutput):
    """loss = mlm_loss + cpc_loss (0-dim); accuracies and counts for logging (0-dim, no gradient)."""

    loss: Tensor | None = None
    mlm_loss: Tensor | None = None
    cpc_loss: Tensor | None = None
    mlm_accuracy: Tensor | None = None
    cpc_accuracy: Tensor | None = None
    mlm_tokens: Tensor | None = None
    cpc_sentences: Tensor | None = None


class MaskedLMTransform(nn.Module):
    """BERT's prediction transform: dense, activation, LayerNorm (before the tied decoder)."""

    def __init__(self, config: GlobalLocalConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = ACT2FN[config.hidden_act]
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.layer_norm(self.activation(self.dense(hidden)))


class GlobalLocalForPretraining(GlobalLocalPreTrainedModel):
    """`self.encoder` (a GlobalLocalModel) + MLM head (decoder tied to the word embeddings) + CPC projection."""

    base_model_prefix = "encoder"

    def __init__(self, config: GlobalLocalConfig):
        super().__init__(config)
        self.encoder = GlobalLocalModel(config)
        self.mlm_transform = MaskedLMTransform(config)
        self.mlm_bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.cpc_projection = nn.Linear(config.hidden_size, config.hidden_size)
        # Sums of the loss parts over training batches since the last evaluation (not weights):
        # the engine logs the total loss, the evaluation callback logs these parts.
        self.training_sums: Counter = Counter()
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if module is getattr(self, "cpc_projection", None):
            # Identity: the first CPC scores compare the encoder's own global outputs; a random
            # 0.02-scale projection left them near zero, and a run of MiniLM at lr 1e-4 stayed at
            # chance for 60 steps.
            init.eye_(module.weight)
            init.zeros_(module.bias)

    def head_state_dict(self) -> dict[str, Tensor]:
        return {name: value for name, value in self.state_dict().items() if not name.startswith("encoder.")}

    def forward(self, mlm_labels: Tensor, cpc_positions: Tensor, **batch: Tensor) -> PretrainingOutput:
        """mlm_labels [B, L] (-100: no target); cpc_positions [N, 2] (example, sentence) of the CPC
        sentences; cpc_* [N, S] the second-pass inputs; the rest are encoder inputs."""
        output = self.encoder(**encoder_inputs(batch))
        targets = mlm_labels != -100
        hidden = output.long_hidden_state[targets]
        logits = F.linear(self.mlm_transform(hidden), self.encoder.embeddings.word_embeddings.weight, self.mlm_bias)
        labels = mlm_labels[targets]
        mlm_loss = F.cross_entropy(logits, labels) if len(labels) else logits.sum() * 0.0
        with torch.no_grad():
            mlm_accuracy = (logits.argmax(-1) == labels).float().mean() if len(labels) else logits.new_zeros(())

        count = len(cpc_positions)
        if count >= 2:
            predicted = self.cpc_projection(output.global_hidden_state[cpc_positions[:, 0], cpc_positions[:, 1]])
            sentences = self.encoder(**encoder_inputs({name[len("cpc_"):]: value for name, value in batch.items()
                                                       if name.startswith("cpc_")}))
            target = sentences.global_hidden_state[:, 0]
            # [N, N] cosine similarities over a temperature; the diagonal holds the right pairs.
            scores = F.normalize(predicted, dim=-1) @ F.normalize(target, dim=-1).T / CPC_TEMPERATURE
            answer = torch.arange(count, device=scores.device)
            cpc_loss = F.cross_entropy(scores, answer)
            with torch.no_grad():
                cpc_accuracy = (scores.argmax(-1) == answer).float().mean()
        else:
            # One CPC sentence has no negatives to be told apart from: no CPC signal in this batch.
            cpc_loss = mlm_loss.new_zeros(())
            cpc_accuracy = mlm_loss.new_zeros(())
        if self.training:
            self.training_sums.update(batches=1, mlm_loss=mlm_loss.item())
            if count >= 2:
                self.training_sums.update(cpc_batches=1, cpc_loss=cpc_loss.item())
        return PretrainingOutput(
            loss=mlm_loss + cpc_loss, mlm_loss=mlm_loss.detach(), cpc_loss=cpc_loss.detach(),
            mlm_accuracy=mlm_accuracy, cpc_accuracy=cpc_accuracy,
            mlm_tokens=torch.tensor(len(labels)), cpc_sentences=torch.tensor(count),
        )

    @classmethod
    def from_encoder(cls, directory: str | Path, encoder_config: dict[str, Any] | None = None,
                     mlm_head_from: str | Path | None = None) -> "GlobalLocalForPretraining":
        """The encoder in `directory` with pretraining heads: restored from its HEADS_FILE (a
        previous pretraining run's output), else the MLM transform and bias from `mlm_head_from`
        (a BERT-family folder holding `cls.predictions.*`, e.g. the checkpoint that was lifted),
        else fresh (drawn from the current torch seed)."""
        from safetensors.torch import load_file

        from longdoc.model.task_model import describe_checkpoint

        found = describe_checkpoint(directory)
        if found.get("task"):
            raise InputError(f"{directory}: holds a trained {found['task']} model, not an encoder; "
                             "pretraining starts from a lifted or pretrained encoder")
        with readable_weights(directory):
            try:
                encoder = GlobalLocalModel.from_pretrained(directory, **(encoder_config or {}))
            except ValueError as error:
                raise InputError(f"{directory}: cannot pretrain from this encoder: {error}") from None
        model = cls(encoder.config)
        model.encoder.load_state_dict(encoder.state_dict())
        heads = Path(directory) / HEADS_FILE
        if heads.is_file():
            with readable_weights(heads):
                head_weights = load_file(heads)
            missing = set(model.head_state_dict()) - set(head_weights)
            if missing:
                raise InputError(f"{heads}: lacks {', '.join(sorted(missing))}")
            model.load_state_dict(head_weights, strict=False)
        elif mlm_head_from is not None:
            model.load_bert_mlm_head(mlm_head_from)
        return model

    def load_bert_mlm_head(self, directory: str | Path) -> None:
        """Copy BERT's MLM transform and output bias (`cls.predictions.*`) from a BERT-family folder."""
        from safetensors import safe_open

        path = Path(directory) / "model.safetensors"
        if not path.is_file():
            raise InputError(f"--mlm-head-from {directory}: no model.safetensors")
        with readable_weights(path), safe_open(str(path), "pt") as weights:
            available = set(weights.keys())
            missing = [source for source in _BERT_MLM_NAMES.values() if source not in available]
            if missing:
                raise InputError(f"--mlm-head-from {directory}: no MLM head weights ({', '.join(missing)} missing)")
            state = {target: weights.get_tensor(source) for target, source in _BERT_MLM_NAMES.items()}
        current = self.state_dict()
        for name, value in state.items():
            if value.shape != current[name].shape:
                raise InputError(f"--mlm-head-from {directory}: {_BERT_MLM_NAMES[name]} has shape "
                                 f"{tuple(value.shape)}, the encoder needs {tuple(current[name].shape)}")
        self.load_state_dict(state, strict=False)

    def write_encoder_folder(self, folder: str | Path, state_dict: dict[str, Tensor] | None = None,
                             tokenizer=None) -> None:
        """The bare encoder (GlobalLocalModel: config.json, model.safetensors), the tokenizer and the
        heads file into `folder`; `state_dict` (this model's, e.g. gathered from shards) or the current weights."""
        from safetensors.torch import save_file

        state_dict = self.state_dict() if state_dict is None else state_dict
        prefix = "encoder."
        encoder_state = {name[len(prefix):]: value for name, value in state_dict.items() if name.startswith(prefix)}
        self.encoder.save_pretrained(folder, state_dict=encoder_state, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        heads = {name: value.contiguous() for name, value in state_dict.items() if not name.startswith(prefix)}
        save_file(heads, str(Path(folder) / HEADS_FILE))

    def save_encoder(self, directory: str | Path, tokenizer=None) -> Path:
        """`write_encoder_folder` into `directory`, atomically: built beside it, then renamed into place."""
        import shutil
        import tempfile

        directory = Path(directory)
        directory.parent.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.", suffix=".tmp"))
        try:
            self.write_encoder_folder(building, tokenizer=tokenizer)
            if directory.exists():
                shutil.rmtree(directory)
            os.rename(building, directory)
        except BaseException:
            shutil.rmtree(building, ignore_errors=True)
            raise
        return directory


# ----------------------------------------------------------------------------------------------
# 5. The job on the training engine

PRETRAINING_NAME = "pretrain"
# The fixed seed of the held-out batches' masking (drawn in a forked RNG, so evaluating never moves
# the training run's random streams, and every evaluation masks the same way).
EVALUATION_SEED = 1234
EVALUATION_FILE = "pretraining_eval.json"


def settings_from_options(options, config: GlobalLocalConfig) -> PretrainingSettings:
    return PretrainingSettings(
        long_length=config.long_max_len, global_max_len=config.global_max_len,
        max_sentence_tokens=options["max_sentence_tokens"], min_sentences=options["min_sentences"],
        mask_rate=options["mask_rate"], cpc_sentence_rate=options["cpc_sentence_rate"],
    )


def _prepared(path, tokenizer, settings, options, what: str):
    documents = read_corpus(path, one_per_line=options["one_per_line"], cache_dir=options.get("cache_dir"))
    inputs, report = prepare_corpus(documents, tokenizer, settings, num_proc=options.get("num_proc"))
    print(f"longdoc pretrain: {what} {path}: {report.inputs} input(s), {report.sentences} sentences, "
          f"{report.tokens} tokens from {report.kept_documents} of {report.documents} document(s) in "
          f"{report.files} file(s); skipped {report.skipped_text(settings.min_sentences)}", file=sys.stderr)
    return inputs


def evaluate_losses(model: GlobalLocalForPretraining, rows, collate, batch_size: int) -> dict[str, float]:
    """Mean MLM and CPC losses and accuracies over `rows`, each batch masked with a fixed seed (the
    same masks at every evaluation, so the numbers are comparable along a run and across runs)."""
    totals: Counter = Counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(EVALUATION_SEED)
        for start in range(0, len(rows), batch_size):
            batch = collate([rows[i] for i in range(start, min(start + batch_size, len(rows)))])
            device = next(model.parameters()).device
            output = model(**{name: value.to(device) for name, value in batch.items()})
            mlm, cpc = int(output.mlm_tokens), int(output.cpc_sentences)
            totals.update(mlm_tokens=mlm, mlm_loss=float(output.mlm_loss) * mlm,
                          mlm_correct=float(output.mlm_accuracy) * mlm)
            if cpc >= 2:
                # CPC is a batch-level task (its candidates are the batch's sentences): averaged per batch.
                totals.update(cpc_batches=1, cpc_candidates=cpc, cpc_loss=float(output.cpc_loss),
                              cpc_accuracy=float(output.cpc_accuracy))
    result = {
        "mlm_loss": totals["mlm_loss"] / max(1, totals["mlm_tokens"]),
        "mlm_accuracy": totals["mlm_correct"] / max(1, totals["mlm_tokens"]),
    }
    if totals["cpc_batches"]:
        result.update(cpc_loss=totals["cpc_loss"] / totals["cpc_batches"],
                      cpc_accuracy=totals["cpc_accuracy"] / totals["cpc_batches"],
                      cpc_candidates=totals["cpc_candidates"] / totals["cpc_batches"])
    result["loss"] = result["mlm_loss"] + result.get("cpc_loss", 0.0)
    return result


def _warn_when_cpc_cannot_train(rows, settings: PretrainingSettings, batch_size: int) -> None:
    """CPC tells a masked sentence from the other CPC sentences of its forward pass: with fewer than
    2 in every pass (one row per pass, one CPC sentence per row) it never trains; say so up front."""
    if settings.cpc_sentence_rate == 0:
        return  # CPC switched off on purpose
    most = max(cpc_sentence_count(n, settings.cpc_sentence_rate) for n in rows["num_sentences"])
    if batch_size * most < 2:
        warnings.warn(f"CPC is not trained: a forward pass of --batch-size {batch_size} holds at most "
                      f"{batch_size * most} CPC sentence(s) (inputs of up to {max(rows['num_sentences'])} sentences "
                      f"at --cpc-sentence-rate {settings.cpc_sentence_rate}) and needs 2, one to find and one to "
                      "tell it from; raise --batch-size or --cpc-sentence-rate", stacklevel=2)


def build_pretraining_job(options):
    """The TrainingJob of `longdoc pretrain` with resolved options: the engine's and the corpus and
    masking ones (`longdoc.commands.pretrain.PRETRAINING_OPTIONS`)."""
    from longdoc.io import atomic_write_json
    from longdoc.convert.checkpoint import read_tokenizer
    from longdoc.train.engine import TrainingJob
    from longdoc.train.options import ENCODER_SWITCHES

    if options.get("init") is not None:
        init = Path(options["init"])
    else:
        from longdoc.convert.pretrained import default_model_path

        init = default_model_path()
    tokenizer = read_tokenizer(init)
    encoder_config = {name: options[name] for name in ENCODER_SWITCHES if options.get(name) is not None}
    encoder_config.setdefault("residual_attention", True)
    torch.manual_seed(options["seed"])  # fresh heads: the same on every process and every rerun
    model = GlobalLocalForPretraining.from_encoder(init, encoder_config=encoder_config,
                                                   mlm_head_from=options.get("mlm_head_from"))
    settings = settings_from_options(options, model.config)
    rows = _prepared(options["train"], tokenizer, settings, options, "corpus")
    held_out = _prepared(options["dev"], tokenizer, settings, options, "held-out corpus") \
        if options.get("dev") is not None else rows
    held_out = held_out.select(range(min(options["eval_rows"], len(held_out))))
    _warn_when_cpc_cannot_train(rows, settings, options["batch_size"])
    collate = PretrainingCollator(tokenizer, settings)

    def evaluate(trained: GlobalLocalForPretraining, folder: Path) -> dict[str, float]:
        sums = trained.training_sums
        metrics = evaluate_losses(trained, held_out, collate, options.get("eval_batch_size") or options["batch_size"])
        if sums["batches"]:
            metrics["train_mlm_loss"] = sums["mlm_loss"] / sums["batches"]
        if sums["cpc_batches"]:
            # Over the batches that had a CPC task: one without (fewer than 2 sentences) adds no zero.
            metrics["train_cpc_loss"] = sums["cpc_loss"] / sums["cpc_batches"]
        sums.clear()
        atomic_write_json(folder / EVALUATION_FILE, metrics)
        return metrics

    def save_model(trained: GlobalLocalForPretraining, folder: Path, state_dict: dict) -> None:
        trained.write_encoder_folder(folder, state_dict, tokenizer)

    return TrainingJob(name=PRETRAINING_NAME, model=model, rows=rows, collate=collate, out_dir=Path(options["out"]),
                       options=options, evaluate=evaluate, save_model=save_model)


def pretrain(options):
    """Continued pretraining with resolved `options` (`longdoc.commands.pretrain.PRETRAINING_OPTIONS`);
    returns the engine's TrainingResult."""
    from longdoc.train.engine import run_training

    return run_training(build_pretraining_job(options))
