"""Shared by the retrieval and index tests: MiniLM's sentence embedder, once per module, and a
wrapper that counts what it embeds (a cached index embeds nothing)."""

import pytest

from longdoc.ask.embedding import SentenceEmbedder


class CountingEmbedder:
    """The real embedder, counting the texts it embeds."""

    def __init__(self, embedder):
        self.inner, self.embedded = embedder, 0
        self.key, self.count_tokens = embedder.key, embedder.count_tokens

    def embed(self, texts, progress=None):
        self.embedded += len(texts)
        return self.inner.embed(texts, progress)


@pytest.fixture(scope="module")
def embedder():
    return SentenceEmbedder()
