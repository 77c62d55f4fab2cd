"""Shared by the retrieval and index tests: MiniLM's sentence embedder, once per module, and a
wrapper that counts what it embeds (a cached index embeds nothing), and damage done to an index file."""

from pathlib import Path

import pytest

from longdoc.ask.embedding import SentenceEmbedder


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
