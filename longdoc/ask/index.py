"""Passage indexes for `longdoc ask`: built once per file content and model, cached on disk.

Per document: its passages (`longdoc.ask.passages`), their embeddings in a faiss inner-product
index (exact search: `IndexFlatIP`; vectors are unit length, so scores are cosine similarities),
and their BM25 index (`longdoc.ask.lexical`, SQLite FTS5), stored under `cache_dir()/ask/KEY/`
where KEY hashes the file's bytes, the embedding model's key and the passage settings. A second
question or a second run finds the folder and embeds nothing; a changed file has another hash, so
it is indexed afresh. The folder holds `meta.json` (passages, settings, and the SHA-256 of each
index file), `index.faiss` (faiss's own serialisation, read only after its hash matches, so a
damaged file never reaches faiss's reader) and `lexical.sqlite` (read only after its hash matches
too). A dense part missing, unreadable or mismatched is rebuilt whole with a warning; a lexical part
alone is rebuilt from the text with a warning, without embedding again. Every file is written
atomically (`longdoc.io`, `longdoc.ask.lexical.write_lexical_index`), `meta.json` last.

`CorpusIndex` puts the documents of one `ask` session into one faiss index and one BM25 index.
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
from longdoc.ask.lexical import LEXICAL_FORMAT, LexicalIndex, write_lexical_index
from longdoc.ask.passages import MAX_TOKENS, MIN_TOKENS, PASSAGE_FORMAT, Passage, split_passages
from longdoc.model.cache import cache_dir
from longdoc.io import atomic_write_bytes, atomic_write_json

CACHE_FORMAT = 1
DENSE_FILE, LEXICAL_FILE, META_FILE = "index.faiss", "lexical.sqlite", "meta.json"
# What a cached folder of the wrong shape raises on reading: faiss's reader (RuntimeError), a
# meta.json whose fields are not what was written (KeyError, TypeError), the checks here (ValueError).
UNUSABLE = (OSError, ValueError, RuntimeError, KeyError, TypeError)


@dataclass
class DocumentIndex:
    source: SourceText
    passages: list[Passage]
    vectors: np.ndarray  # [passages, dimension] float32, unit rows
    lexical_path: Path  # the BM25 index of the passages' sentences (rows in order: sentence_texts())

    def passage_text(self, passage: Passage) -> str:
        return self.source.text[passage.start:passage.end]

    def sentence_texts(self) -> list[str]:
        return [self.source.text[start:end] for passage in self.passages for start, end in passage.sentences]


def _settings(embedder, max_tokens: int, min_tokens: int) -> dict:
    return {"cache_format": CACHE_FORMAT, "passage_format": PASSAGE_FORMAT, "model": embedder.key,
            "max_tokens": max_tokens, "min_tokens": min_tokens}


def cache_folder(source: SourceText, settings: dict, root: Path | None = None) -> Path:
    key = hashlib.sha256(json.dumps({"sha256": source.sha256, **settings}, sort_keys=True).encode()).hexdigest()
    return (cache_dir() / "ask" if root is None else root) / key[:32]


def _load(folder: Path, source: SourceText, settings: dict) -> tuple[DocumentIndex, dict] | None:
    """The cached index and its meta.json, None when there is none; raises one of UNUSABLE when its
    dense part is damaged or stale."""
    import faiss

    meta_path = folder / META_FILE
    if not meta_path.exists():
        return None
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if not isinstance(meta, dict):
        raise ValueError(f"{META_FILE} is not an object")
    if meta.get("settings") != settings or meta.get("sha256") != source.sha256:
        raise ValueError("made with other settings or for other content")
    data = (folder / DENSE_FILE).read_bytes()
    if hashlib.sha256(data).hexdigest() != meta.get("index_sha256"):
        raise ValueError(f"{DENSE_FILE} does not match its recorded hash")
    index = faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
    passages = [Passage(start, end, tuple(tuple(s) for s in sentences)) for start, end, sentences in meta["passages"]]
    if index.ntotal != len(passages) or not all(0 <= p.start < p.end <= len(source.text) for p in passages):
        raise ValueError("passages do not fit the document")
    return DocumentIndex(source, passages, index.reconstruct_n(0, index.ntotal), folder / LEXICAL_FILE), meta


def _check_lexical(document: DocumentIndex, meta: dict) -> None:
    """Raises one of UNUSABLE unless the folder's lexical index is the one meta.json records."""
    lexical = meta.get("lexical")
    if not isinstance(lexical, dict):
        raise ValueError(f"no {LEXICAL_FILE} recorded")
    if lexical.get("format") != LEXICAL_FORMAT:
        raise ValueError(f"{LEXICAL_FILE} has format {lexical.get('format')}, this version reads {LEXICAL_FORMAT}")
    if hashlib.sha256(document.lexical_path.read_bytes()).hexdigest() != lexical.get("sha256"):
        raise ValueError(f"{LEXICAL_FILE} does not match its recorded hash")
    LexicalIndex.open(document.lexical_path, sum(len(p.sentences) for p in document.passages)).close()


def _meta(document: DocumentIndex, settings: dict, index_sha256: str) -> dict:
    lexical_sha256 = hashlib.sha256(document.lexical_path.read_bytes()).hexdigest()
    return {"settings": settings, "sha256": document.source.sha256, "path": document.source.path,
            "index_sha256": index_sha256, "lexical": {"format": LEXICAL_FORMAT, "sha256": lexical_sha256},
            "passages": [[p.start, p.end, [list(s) for s in p.sentences]] for p in document.passages]}


def _save_lexical(document: DocumentIndex) -> None:
    write_lexical_index(document.lexical_path, document.sentence_texts())


def _save(folder: Path, document: DocumentIndex, settings: dict) -> None:
    import faiss

    index = faiss.IndexFlatIP(document.vectors.shape[1])
    index.add(document.vectors)
    data = faiss.serialize_index(index).tobytes()
    atomic_write_bytes(folder / DENSE_FILE, data)
    _save_lexical(document)
    # meta.json last: a folder with a meta.json names index files that are already complete.
    atomic_write_json(folder / META_FILE, _meta(document, settings, hashlib.sha256(data).hexdigest()), indent=None)


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
        except UNUSABLE as error:
            warnings.warn(f"{source.path}: cached index in {folder} is unusable ({error}); rebuilding it",
                          stacklevel=2)
            found = None
        if found is not None:
            document, meta = found
            try:
                _check_lexical(document, meta)
            except UNUSABLE as error:
                warnings.warn(f"{source.path}: cached lexical index in {folder} is unusable ({error}); "
                              "rebuilding it", stacklevel=2)
                _save_lexical(document)
                atomic_write_json(folder / META_FILE, _meta(document, settings, meta["index_sha256"]), indent=None)
            found = document
        indexes.append(found)
        if found is None:
            missing.append(len(indexes) - 1)
    if missing:
        split = {i: split_passages(sources[i].text, embedder.count_tokens, max_tokens, min_tokens) for i in missing}
        total = sum(len(passages) for passages in split.values())
        with tqdm(total=total, desc="indexing", unit=" passages", file=sys.stderr, disable=not progress) as bar:
            for i in missing:
                source, passages = sources[i], split[i]
                folder = cache_folder(source, settings, cache_root)
                vectors = embedder.embed([source.text[p.start:p.end] for p in passages], progress=bar)
                indexes[i] = DocumentIndex(source, passages, vectors, folder / LEXICAL_FILE)
                _save(folder, indexes[i], settings)
    return indexes


@dataclass(frozen=True)
class Rank:
    """A ranking that put a passage among those read: by which retriever, in which hop, at which place
    (1: first)."""
    retriever: str  # longdoc.ask.retrieve.DENSE or LEXICAL
    hop: int  # 1: the question; 2: the question and a bridge sentence
    rank: int

    def to_json(self) -> dict:
        return {"retriever": self.retriever, "hop": self.hop, "rank": self.rank}


@dataclass(frozen=True)
class Hit:
    document: int  # index into CorpusIndex.documents
    passage: int  # index into that document's passages
    score: float
    found_by: tuple[Rank, ...] = ()  # the rankings that chose it (longdoc.ask.retrieve); () when all is read


class CorpusIndex:
    """The passages of several documents in one faiss index and their sentences in one BM25 index.
    One document's BM25 index is its cached file; several documents' sentences are indexed together
    in memory (BM25's word statistics are over the whole corpus, so scores compare across documents)."""

    def __init__(self, documents: Sequence[DocumentIndex]):
        import faiss

        self.documents = list(documents)
        self.locations = [(d, p) for d, document in enumerate(self.documents) for p in range(len(document.passages))]
        dimension = self.documents[0].vectors.shape[1] if self.documents else 1
        self.index = faiss.IndexFlatIP(dimension)
        if self.locations:
            self.index.add(np.concatenate([document.vectors for document in self.documents]))
        # The passage of each BM25 row (sentence), rows in file order.
        self.sentence_locations = [(d, p) for d, p in self.locations for _ in self.documents[d].passages[p].sentences]
        if len(self.documents) == 1:
            self.lexical = LexicalIndex.open(self.documents[0].lexical_path, len(self.sentence_locations))
        else:
            self.lexical = LexicalIndex.in_memory(text for document in self.documents
                                                  for text in document.sentence_texts())

    def search(self, vectors: np.ndarray, k: int) -> list[list[Hit]]:
        """The k nearest passages to each query vector, best first (scores: cosines)."""
        k = min(k, len(self.locations))
        if k == 0:
            return [[] for _ in range(len(vectors))]
        scores, ids = self.index.search(np.ascontiguousarray(vectors, dtype=np.float32), k)
        return [[Hit(*self.locations[i], float(s)) for s, i in zip(row_scores, row_ids) if i >= 0]
                for row_scores, row_ids in zip(scores, ids)]

    def search_text(self, text: str, k: int) -> list[Hit]:
        """The k best passages for `text` by the BM25 score of their best sentence, best first; only
        passages sharing a word with it."""
        best: dict[tuple[int, int], float] = {}
        for row, score in self.lexical.search(text):
            if len(best) == k:
                break
            best.setdefault(self.sentence_locations[row], score)
        return [Hit(d, p, score) for (d, p), score in best.items()]

    def cosine(self, vector: np.ndarray, hit: Hit) -> float:
        return float(self.documents[hit.document].vectors[hit.passage] @ vector)

    def passage(self, hit: Hit) -> Passage:
        return self.documents[hit.document].passages[hit.passage]

    def text(self, hit: Hit) -> str:
        document = self.documents[hit.document]
        return document.passage_text(document.passages[hit.passage])
