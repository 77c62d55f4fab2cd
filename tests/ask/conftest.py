"""Shared by the retrieval and index tests: MiniLM's sentence embedder, once per module, and a
wrapper that counts what it embeds (a cached index embeds nothing)."""

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
