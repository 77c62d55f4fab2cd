"""Passage indexes for `longdoc ask`: embedded once per file content and model, cached on disk.

Per document: its passages (`longdoc.ask.passages`) and their embeddings in a faiss inner-product
index (exact search: `IndexFlatIP`; vectors are unit length, so scores are cosine similarities),
stored under `cache_dir()/ask/KEY/` where KEY hashes the file's bytes, the embedding model's key and
the passage settings. A second question or a second run finds the folder and embeds nothing; a
changed file has another hash, so it is indexed afresh. The folder holds `meta.json` (passages,
settings, and the SHA-256 of the index file) and `index.faiss` (faiss's own serialisation, read
only after its hash matches, so a damaged file never reaches faiss's reader); anything missing,
unreadable or mismatched is rebuilt with a warning. Writes are atomic (`longdoc.io`).

`CorpusIndex` puts the documents of one `ask` session into one faiss index for search.
"""

import hashlib
import json
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from longdoc.ask.documents import SourceText
from longdoc.ask.passages import MAX_TOKENS, MIN_TOKENS, PASSAGE_FORMAT, Passage, split_passages
from longdoc.model.cache import cache_dir
from longdoc.io import atomic_write_bytes, atomic_write_json

CACHE_FORMAT = 1


@dataclass
class DocumentIndex:
    source: SourceText
    passages: list[Passage]
    vectors: np.ndarray  # [passages, dimension] float32, unit rows

    def passage_text(self, passage: Passage) -> str:
        return self.source.text[passage.start:passage.end]


def _settings(embedder, max_tokens: int, min_tokens: int) -> dict:
    return {"cache_format": CACHE_FORMAT, "passage_format": PASSAGE_FORMAT, "model": embedder.key,
            "max_tokens": max_tokens, "min_tokens": min_tokens}


def cache_folder(source: SourceText, settings: dict, root: Path | None = None) -> Path:
    key = hashlib.sha256(json.dumps({"sha256": source.sha256, **settings}, sort_keys=True).encode()).hexdigest()
    return (cache_dir() / "ask" if root is None else root) / key[:32]


def _load(folder: Path, source: SourceText, settings: dict) -> DocumentIndex | None:
    """The cached index, None when there is none; raises ValueError when it is damaged or stale."""
    import faiss

    meta_path, index_path = folder / "meta.json", folder / "index.faiss"
    if not meta_path.exists():
        return None
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("settings") != settings or meta.get("sha256") != source.sha256:
        raise ValueError("made with other settings or for other content")
    data = index_path.read_bytes()
    if hashlib.sha256(data).hexdigest() != meta.get("index_sha256"):
        raise ValueError("index.faiss does not match its recorded hash")
    index = faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
    passages = [Passage(start, end, tuple(tuple(s) for s in sentences)) for start, end, sentences in meta["passages"]]
    if index.ntotal != len(passages) or not all(0 <= p.start < p.end <= len(source.text) for p in passages):
        raise ValueError("passages do not fit the document")
    return DocumentIndex(source, passages, index.reconstruct_n(0, index.ntotal))


def _save(folder: Path, document: DocumentIndex, settings: dict) -> None:
    import faiss

    index = faiss.IndexFlatIP(document.vectors.shape[1])
    index.add(document.vectors)
    data = faiss.serialize_index(index).tobytes()
    atomic_write_bytes(folder / "index.faiss", data)
    # meta.json last: a folder with a meta.json names an index file that is already complete.
    atomic_write_json(folder / "meta.json", {
        "settings": settings, "sha256": document.source.sha256, "path": document.source.path,
        "index_sha256": hashlib.sha256(data).hexdigest(),
        "passages": [[p.start, p.end, [list(s) for s in p.sentences]] for p in document.passages],
    }, indent=None)


def index_documents(sources: Sequence[SourceText], embedder, *, max_tokens: int = MAX_TOKENS,
                    min_tokens: int = MIN_TOKENS, cache_root: Path | None = None,
                    progress: bool = True) -> list[DocumentIndex]:
    """One DocumentIndex per source: from the cache when it holds a sound one, else embedded now
    (with a progress bar on stderr) and cached."""
    from tqdm.auto import tqdm

    settings = _settings(embedder, max_tokens, min_tokens)
    indexes: list[DocumentIndex | None] = []
    missing = []
    for source in sources:
        folder = cache_folder(source, settings, cache_root)
        try:
            found = _load(folder, source, settings)
        except (OSError, ValueError, RuntimeError, KeyError, TypeError) as error:
            # RuntimeError: faiss's reader; the others: a meta.json of the wrong shape.
            warnings.warn(f"{source.path}: cached index in {folder} is unusable ({error}); rebuilding it",
                          stacklevel=2)
            found = None
        indexes.append(found)
        if found is None:
            missing.append(len(indexes) - 1)
    if missing:
        split = {i: split_passages(sources[i].text, embedder.count_tokens, max_tokens, min_tokens) for i in missing}
        total = sum(len(passages) for passages in split.values())
        with tqdm(total=total, desc="indexing", unit=" passages", file=sys.stderr, disable=not progress) as bar:
            for i in missing:
                source, passages = sources[i], split[i]
                vectors = embedder.embed([source.text[p.start:p.end] for p in passages], progress=bar)
                indexes[i] = DocumentIndex(source, passages, vectors)
                _save(cache_folder(source, settings, cache_root), indexes[i], settings)
    return indexes


@dataclass(frozen=True)
class Hit:
    document: int  # index into CorpusIndex.documents
    passage: int  # index into that document's passages
    score: float


class CorpusIndex:
    """The passages of several documents in one faiss index."""

    def __init__(self, documents: Sequence[DocumentIndex]):
        import faiss

        self.documents = list(documents)
        self.locations = [(d, p) for d, document in enumerate(self.documents) for p in range(len(document.passages))]
        dimension = self.documents[0].vectors.shape[1] if self.documents else 1
        self.index = faiss.IndexFlatIP(dimension)
        if self.locations:
            self.index.add(np.concatenate([document.vectors for document in self.documents]))

    def search(self, vectors: np.ndarray, k: int) -> list[list[Hit]]:
        """The k nearest passages to each query vector, best first."""
        k = min(k, len(self.locations))
        if k == 0:
            return [[] for _ in range(len(vectors))]
        scores, ids = self.index.search(np.ascontiguousarray(vectors, dtype=np.float32), k)
        return [[Hit(*self.locations[i], float(s)) for s, i in zip(row_scores, row_ids) if i >= 0]
                for row_scores, row_ids in zip(scores, ids)]

    def passage(self, hit: Hit) -> Passage:
        return self.documents[hit.document].passages[hit.passage]

    def text(self, hit: Hit) -> str:
        document = self.documents[hit.document]
        return document.passage_text(document.passages[hit.passage])
