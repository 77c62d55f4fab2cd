"""Shared by the retrieval and index tests: MiniLM's sentence embedder, once per module, and a
wrapper that counts what it embeds (a cached index embeds nothing), and damage done to an index file;
by the reader's tests: a small lifted extractive QA reader."""

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertForQuestionAnswering

from longdoc.ask.embedding import SentenceEmbedder
from longdoc.cli import main
from longdoc.convert.pretrained import minilm_path


class CountingEmbedder:
    """The real embedder, counting the texts it embeds."""

    def __init__(self, embedder):
        self.inner, self.embedded = embedder, 0
        self.key, self.count_tokens, self.dimension = embedder.key, embedder.count_tokens, embedder.dimension

    def embed(self, texts, progress=None):
        self.embedded += len(texts)
        return self.inner.embed(texts, progress)


def indexed_texts(documents) -> int:
    """What indexing embeds for `documents` (longdoc.ask.index.DocumentIndex): each passage and each of
    its sentences."""
    return sum(len(document.passages) + sum(len(passage.sentences) for passage in document.passages)
               for document in documents)


@pytest.fixture(scope="module")
def embedder():
    return SentenceEmbedder()


def damage_index(path: Path) -> None:
    """Overwrites a corpus index file and its WAL journal past their first bytes, as a bad disk or a
    stray write would."""
    for damaged, keep in ((path, 4096), (Path(f"{path}-wal"), 32)):
        size = damaged.stat().st_size if damaged.exists() else 0
        if size:
            with open(damaged, "r+b") as file:
                file.seek(keep)
                file.write(b"\xa5" * (size - keep))


@pytest.fixture(scope="module")
def lifted_reader(tmp_path_factory):
    """A random BertForQuestionAnswering (MiniLM's uncased WordPiece, 512 positions) saved as Hub readers
    are, and the span reader `longdoc lift` makes of it."""
    root = tmp_path_factory.mktemp("reader")
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    torch.manual_seed(0)
    source = BertForQuestionAnswering(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=64, num_hidden_layers=2,
                                                 num_attention_heads=4, intermediate_size=128,
                                                 max_position_embeddings=512))
    with torch.no_grad():  # logits far apart, so that the best span is not a near tie
        source.qa_outputs.weight.mul_(50)
    source.save_pretrained(root / "source")
    tokenizer.save_pretrained(root / "source")
    assert main(["lift", "--from", str(root / "source"), "--out", str(root / "lifted")]) == 0
    return root
