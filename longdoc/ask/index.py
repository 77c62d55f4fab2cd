"""The corpus index of `longdoc ask`, `longdoc index` and `longdoc serve`: one SQLite file a corpus.

A corpus is the documents under the paths it is named by (a folder, a list of files); its index is
`cache_dir()/ask/corpus/KEY/index.sqlite`, KEY hashing those paths (resolved) and the settings (the
embedding model's key, the passage rules, the formats). It holds, per document (by its resolved
path): the SHA-256 of its bytes, its passages (`longdoc.ask.passages`), their MiniLM vectors and
the vectors of each of their sentences; and for all documents together the sentences' BM25 table
(`longdoc.ask.lexical`, FTS5). A question embeds only itself and its second hop's queries: the
sentences it is compared with were embedded when their document was indexed.

Why one SQLite file: a transaction writes whole or not at all, so a chunk of documents (CHUNK_TEXTS
passages and sentences, embedded together, which also bounds the memory of indexing) is committed
at once: indexing stopped by Ctrl-C or kill -9 keeps the chunks committed, and a rerun goes on from
the first document missing, in the same chunks, so it ends with the contents of an uninterrupted
run and indexes nothing twice. Its WAL journal lets a session read one snapshot while another
process updates the file. Processes that update the same corpus take turns on a lock file beside it
(`fcntl.flock`; the second says once on stderr that it waits, --quiet or not). A session reads a
document's passage vectors when it first needs them: for an exact search, all of them, put in the
documents' order into a faiss inner-product index (`IndexFlatIP`; the vectors are unit length, so
scores are cosines), as the flat index a file would hold is these vectors anyway.

Beyond APPROXIMATE_FROM passages an exact search costs a question more with every document (each of
its four or so searches reads every vector) while an HNSW graph's stays near constant, so an update
that leaves that many builds a faiss HNSW index over all passage vectors (documents by their id in
the file) and stores it beside the file (APPROXIMATE_FILE, written whole before the row naming it is
committed): a question maps it into memory (faiss's IO_FLAG_MMAP_IFC) and reads only the pages its
search visits, where reading it whole (139 MB at 77,000 passages) took a question half a second.
HNSW rather than IVF: it needs no training on the corpus (IVF's centroids, trained on the documents
of one day, fit the corpus less as it grows, and reach a recall of 0.98 only with many lists
probed), and its recall is set at search time (HNSW_EF_SEARCH). It is built again whenever the
documents changed, on one thread, so that a resumed indexing stores the graph an uninterrupted one
stores. A search for more passages than HNSW_EF_SEARCH (reading everything) stays exact.

Incremental by content: a document indexed with the same hash is kept, a changed one is indexed
again, one no longer among the documents (removed, or unreadable now) is dropped with a warning.
A question over an unchanged corpus reads none of its files whole: each document's file signature
(size, modification and change times, inode, device) is recorded with its hash, and `read_corpus`
hashes only the files whose signature differs (as git and make trust a file's status; a file
touched with the same bytes is hashed, kept, and its signature recorded). The change time is what
catches a file rewritten to as many bytes with its modification time set back: any write or
`os.utime` sets it to the present, and nothing sets it back. A signature taken within RACY_NS of a
write is not recorded (git's racy-clean rule: a second write in the same clock tick would leave it
equal), so that file is hashed at the next run. The text of a document not read is read when a
passage of it is used, and its hash checked then: a file changed meanwhile ends the question with an
InputError naming it, never a stale offset. A
file SQLite cannot read, or one of other settings, is removed and built again with a warning naming it;
one damaged while a session reads it ends that session's question with an InputError naming it (the
next run rebuilds it).
"""

import bisect
import contextlib
import fcntl
import hashlib
import json
import sqlite3
import sys
import time
import warnings
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from longdoc.ask.documents import IndexedFile, SourceError, SourceText, load_sources, signature_text
from longdoc.ask.lexical import LEXICAL_FORMAT, LexicalIndex, add_rows, create_table, delete_rows
from longdoc.ask.passages import MAX_TOKENS, MIN_TOKENS, PASSAGE_FORMAT, Passage, split_passages
from longdoc.errors import InputError
from longdoc.io import atomic_write_bytes
from longdoc.model.cache import cache_dir

INDEX_FORMAT = 3
INDEX_FILE, LOCK_FILE = "index.sqlite", "lock"
# Passages and sentences embedded and committed together: what indexing holds in memory at once, and
# what a kill loses.
CHUNK_TEXTS = 1024
# Passages from which a corpus gets an approximate (HNSW) vector index; below, exact search (a
# question's four searches over 20,000 passages read 120 MB of vectors, a few milliseconds each).
APPROXIMATE_FROM = 20_000
HNSW_NEIGHBOURS, HNSW_EF_CONSTRUCTION, HNSW_EF_SEARCH = 32, 80, 128
# Sentences a lexical search scores first, those holding the query's rarest words, by those words:
# their k-th best passage decides which others can rank (CorpusIndex.search_text).
PROBE_ROWS = 2048
# The HNSW index of the passage vectors, one row when the corpus has APPROXIMATE_FROM passages or more:
# the document ids in the order its vectors were added (each document's passages in turn), and the name
# and size of the file beside the index file that holds it (APPROXIMATE_FILE: named by those ids, so
# that a reader's snapshot names a file no later build overwrites in place).
APPROXIMATE_TABLE = ("CREATE TABLE IF NOT EXISTS approximate (documents TEXT NOT NULL, file TEXT NOT NULL, "
                     "bytes INTEGER NOT NULL)")
APPROXIMATE_FILE = "hnsw-{}.faiss"
SCHEMA = (
    "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    # signature: the file's when it was read (JSON; NULL: none to trust), checked before its hash;
    # characters, words (split at whitespace) and page_starts: its text's length and a PDF's page
    # starts, known without reading it.
    "CREATE TABLE documents (id INTEGER PRIMARY KEY, path TEXT NOT NULL UNIQUE, sha256 TEXT NOT NULL, "
    "signature TEXT, characters INTEGER NOT NULL, words INTEGER NOT NULL, page_starts TEXT NOT NULL, "
    "passages TEXT NOT NULL, first_row INTEGER NOT NULL, sentences INTEGER NOT NULL, passage_vectors BLOB NOT NULL)",
    "CREATE TABLE sentence_vectors (document INTEGER PRIMARY KEY, vectors BLOB NOT NULL)",
    APPROXIMATE_TABLE,
)


class DamagedIndex(ValueError):
    """An index file whose contents are not what this module writes."""


@dataclass(frozen=True)
class IndexSettings:
    """What the vectors and rows of an index depend on: the embedding model (its key) and the passage
    rules; an index made with others is another index."""

    model: str
    max_tokens: int = MAX_TOKENS
    min_tokens: int = MIN_TOKENS

    def to_json(self) -> dict:
        return {"index_format": INDEX_FORMAT, "passage_format": PASSAGE_FORMAT, "lexical_format": LEXICAL_FORMAT,
                "model": self.model, "max_tokens": self.max_tokens, "min_tokens": self.min_tokens}


@dataclass(frozen=True)
class IndexChanges:
    """What an update did: the files indexed (new, or changed since), those dropped, those kept."""

    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    kept: int = 0

    def describe(self) -> str | None:
        """One line for the user ("2 files indexed (1 new, 1 changed), 1 dropped, 519 unchanged"); None
        when nothing changed."""
        if not (self.added or self.changed or self.dropped):
            return None
        indexed = len(self.added) + len(self.changed)
        parts = [f"{indexed} {'file' if indexed == 1 else 'files'} indexed ({len(self.added)} new, "
                 f"{len(self.changed)} changed)"]
        if self.dropped:
            parts.append(f"{len(self.dropped)} dropped")
        return ", ".join(parts + [f"{self.kept} unchanged"])


@dataclass
class DocumentIndex:
    source: SourceText
    stored_passages: str  # its passages as the file holds them (JSON), parsed when first used: `passages`
    passage_count: int  # its passages' vectors: CorpusIndex.passage_vectors
    key: int  # its id in the index file
    first_row: int  # the BM25 row of its first sentence; its sentences follow in passage order
    words: int  # in its text, split at whitespace: each is one wordpiece or more, read or not
    sentences: int  # in its passages: its rows of the BM25 table
    characters: int  # of its text

    @cached_property
    def passages(self) -> list[Passage]:
        """Parsed on first use: a question reads a few documents' passages, and parsing every
        document's when a session opens was most of its cost at thousands of files."""
        try:
            passages = [Passage(start, end, tuple((s, e) for s, e in sentences))
                        for start, end, sentences in json.loads(self.stored_passages)]
        except (ValueError, TypeError) as error:
            raise DamagedIndex(f"the passages of {self.source.path} are unreadable ({error})") from None
        if (len(passages) != self.passage_count or sum(len(p.sentences) for p in passages) != self.sentences
                or not all(0 <= p.start < p.end <= self.characters for p in passages)):
            raise DamagedIndex(f"the passages of {self.source.path} do not fit it")
        return passages

    @cached_property
    def sentence_passages(self) -> list[int]:
        """The passage of each of its sentences, in order."""
        return [p for p, passage in enumerate(self.passages) for _ in passage.sentences]

    def passage_text(self, passage: Passage) -> str:
        return self.source.text[passage.start:passage.end]


def document_path(source: SourceText) -> str:
    """The name a document is indexed under: its resolved path."""
    return source.resolved_path


def corpus_folder(named_by: Sequence[str], settings: IndexSettings, root: Path | None = None) -> Path:
    """The folder of the index of the corpus named by the paths `named_by` (files and folders)."""
    paths = sorted({str(Path(path).resolve()) for path in named_by})
    key = hashlib.sha256(json.dumps({"paths": paths, **settings.to_json()}, sort_keys=True).encode()).hexdigest()
    return (cache_dir() / "ask" if root is None else root) / "corpus" / key[:32]


@contextlib.contextmanager
def _transaction(connection: sqlite3.Connection) -> Iterator[None]:
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")


def _is_damage(error: Exception) -> bool:
    """Whether `error` says the file is not a sound index (and not that another process holds it)."""
    if isinstance(error, DamagedIndex):
        return True
    return isinstance(error, sqlite3.DatabaseError) and "locked" not in str(error)


class CorpusStore:
    """The index file of one corpus: `update` makes it hold the documents given, `open` also returns
    them as a CorpusIndex, read from one snapshot of the file."""

    def __init__(self, folder: Path, settings: IndexSettings):
        self.folder, self.settings = Path(folder), settings
        self.path = self.folder / INDEX_FILE
        self.committed = 0  # documents this process has indexed and committed (what an interruption keeps)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / LOCK_FILE, "a+b") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # said even under --quiet (which hides warnings): a wait is not silent
                print(f"longdoc: {self.path}: another process is updating this corpus index; waiting for it",
                      file=sys.stderr, flush=True)
                fcntl.flock(lock, fcntl.LOCK_EX)
            yield  # the lock goes with the file's closing

    def _connect(self) -> sqlite3.Connection:
        """The index file, created when missing; DamagedIndex or sqlite3.DatabaseError when it is not sound."""
        connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=600)
        try:
            connection.execute("PRAGMA journal_mode = WAL")
            tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not tables:
                with _transaction(connection):
                    for statement in SCHEMA:
                        connection.execute(statement)
                    create_table(connection)
                    connection.executemany("INSERT INTO meta VALUES (?, ?)",
                                           [("settings", json.dumps(self.settings.to_json(), sort_keys=True)),
                                            ("next_row", "0")])
            else:
                # Files of earlier versions hold the same rows: one with no approximate table, or with the
                # graph inside it, gets this version's table, and its next update builds the graph.
                if "hnsw" in {column for _, column, *_ in connection.execute("PRAGMA table_info(approximate)")}:
                    connection.execute("DROP TABLE approximate")
                connection.execute(APPROXIMATE_TABLE)
            settings = connection.execute("SELECT value FROM meta WHERE name = 'settings'").fetchone()
            if settings is None or settings[0] != json.dumps(self.settings.to_json(), sort_keys=True):
                raise DamagedIndex(f"made with other settings ({None if settings is None else settings[0]})")
        except BaseException:
            connection.close()
            raise
        return connection

    def _remove(self, error: Exception) -> None:
        warnings.warn(f"{self.path}: the corpus index is unusable ({error}); rebuilding it", stacklevel=2)
        _remove_index_file(self.path)

    def indexed_files(self) -> dict[str, IndexedFile]:
        """What the file recorded of each document's file, by resolved path (`load_sources`' `indexed`);
        empty when there is no sound file of these settings (the update says why, and rebuilds it)."""
        if not self.path.exists():
            return {}
        try:
            connection = sqlite3.connect(self.path, isolation_level=None, timeout=600)
            try:
                settings = connection.execute("SELECT value FROM meta WHERE name = 'settings'").fetchone()
                if settings is None or settings[0] != json.dumps(self.settings.to_json(), sort_keys=True):
                    return {}
                return {path: IndexedFile(signature, sha256,
                                          () if page_starts == "[]" else tuple(json.loads(page_starts)))
                        for path, sha256, signature, page_starts in
                        connection.execute("SELECT path, sha256, signature, page_starts FROM documents")}
            finally:
                connection.close()
        except (sqlite3.DatabaseError, ValueError, TypeError):
            return {}

    def update(self, sources: Sequence[SourceText], embedder, *, progress: bool = True,
               on_indexed: Callable[[SourceText, int], None] | None = None) -> IndexChanges:
        """Makes the file hold `sources` (see the module docstring); `on_indexed(source, passages)` is
        called as each document is committed."""
        with self._locked():
            connection, changes = self._sound_connection(
                lambda connection: self._update(connection, sources, embedder, progress, on_indexed))
            connection.close()
        return changes

    def open(self, sources: Sequence[SourceText], embedder, *, progress: bool = True,
             on_indexed: Callable[[SourceText, int], None] | None = None) -> "CorpusIndex":
        """`update`, then the documents as they are in the file now, read from one snapshot that the
        returned CorpusIndex keeps for its life (another process's later update does not change it)."""
        def updated_and_read(connection: sqlite3.Connection) -> CorpusIndex:
            changes = self._update(connection, sources, embedder, progress, on_indexed)
            connection.execute("BEGIN")
            return CorpusIndex(connection, sources, changes, embedder.dimension, self.path)

        with self._locked():
            return self._sound_connection(updated_and_read)[1]

    def _sound_connection(self, work: Callable[[sqlite3.Connection], Any]) -> tuple[sqlite3.Connection, Any]:
        """The connection `work` ran on and what it returned; a damaged file is removed (with a warning)
        and `work` run again on a new one."""
        for attempt in (1, 2):
            connection = None
            try:
                connection = self._connect()
                return connection, work(connection)
            except (sqlite3.DatabaseError, DamagedIndex) as error:
                if connection is not None:
                    connection.close()
                if attempt == 2 or not _is_damage(error):
                    raise
                self._remove(error)
            except BaseException:
                if connection is not None:
                    connection.close()
                raise

    def _update(self, connection: sqlite3.Connection, sources: Sequence[SourceText], embedder, progress: bool,
                on_indexed: Callable[[SourceText, int], None] | None) -> IndexChanges:
        indexed = {path: (key, sha256, first_row, rows, signature) for key, path, sha256, first_row, rows, signature
                   in connection.execute("SELECT id, path, sha256, first_row, sentences, signature FROM documents")}
        wanted = {document_path(source): source for source in sources}
        stale = [path for path, (_, sha256, _, _, _) in indexed.items()
                 if path not in wanted or wanted[path].sha256 != sha256]
        kept = indexed.keys() - set(stale)
        missing = [source for path, source in wanted.items() if path not in kept]
        # Kept files read again (touched, copied, or racy before): their signature now, so that the
        # next run trusts it rather than hash them again.
        signatures = {path: _signature_json(wanted[path]) for path in kept}
        touched = [(signatures[path], indexed[path][0]) for path in kept if signatures[path] != indexed[path][4]]
        if touched:
            with _transaction(connection):
                connection.executemany("UPDATE documents SET signature = ? WHERE id = ?", touched)
        if stale:
            with _transaction(connection):
                for path in stale:
                    key, _, first_row, rows, _ = indexed[path]
                    connection.execute("DELETE FROM documents WHERE id = ?", (key,))
                    connection.execute("DELETE FROM sentence_vectors WHERE document = ?", (key,))
                    delete_rows(connection, first_row, rows)
        dropped = tuple(path for path in stale if path not in wanted)
        for path in dropped:
            warnings.warn(f"{path}: indexed before, and no longer among the documents (removed or unreadable): "
                          "dropped from the index", stacklevel=2)
        if missing:
            self._index(connection, missing, embedder, progress, on_indexed)
        _store_approximate(connection, embedder.dimension, self.folder, progress)
        return IndexChanges(tuple(source.path for source in missing if document_path(source) not in indexed),
                            tuple(source.path for source in missing if document_path(source) in indexed),
                            dropped, len(wanted) - len(missing))

    def _index(self, connection: sqlite3.Connection, sources: Sequence[SourceText], embedder, progress: bool,
               on_indexed: Callable[[SourceText, int], None] | None) -> None:
        """Indexes `sources` in chunks of about CHUNK_TEXTS texts, each committed whole, with a progress
        bar of files, words and words a second on stderr."""
        from tqdm.auto import tqdm

        started, words = time.perf_counter(), 0
        with tqdm(total=len(sources), desc="indexing", unit=" files", file=sys.stderr, disable=not progress) as bar:
            pending, texts = [], 0
            for number, source in enumerate(sources):
                passages = split_passages(source.text, embedder.count_tokens, self.settings.max_tokens,
                                          self.settings.min_tokens)
                pending.append((source, passages))
                texts += len(passages) + sum(len(passage.sentences) for passage in passages)
                if texts < CHUNK_TEXTS and number < len(sources) - 1:
                    continue
                _save(connection, pending, embedder)
                self.committed += len(pending)
                for done, done_passages in pending:
                    words += len(done.text.split())
                    if on_indexed is not None:
                        on_indexed(done, len(done_passages))
                bar.set_postfix_str(f"{words:,} words, {words / (time.perf_counter() - started):,.0f} words/s",
                                    refresh=False)
                bar.update(len(pending))
                pending, texts = [], 0


def _remove_index_file(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    _remove_approximate_files(path.parent)


def _remove_approximate_files(folder: Path, keep: str | None = None) -> None:
    """The HNSW files in `folder` but `keep` (and those a stopped build left), removed."""
    pattern = APPROXIMATE_FILE.format("*")
    for stale in [*folder.glob(pattern), *folder.glob(f".{pattern}.*.tmp")]:
        if stale.name != keep:
            stale.unlink(missing_ok=True)


def _signature_json(source: SourceText) -> str | None:
    return None if source.signature is None else signature_text(source.signature)


def _save(connection: sqlite3.Connection, documents: Sequence[tuple[SourceText, list[Passage]]], embedder) -> None:
    """Embeds the passages and sentences of `documents` and writes them in one transaction."""
    passage_texts = [source.text[p.start:p.end] for source, passages in documents for p in passages]
    sentence_texts = [source.text[start:end] for source, passages in documents for p in passages
                      for start, end in p.sentences]
    vectors = embedder.embed(passage_texts + sentence_texts)
    passage_vectors, sentence_vectors = vectors[:len(passage_texts)], vectors[len(passage_texts):]
    with _transaction(connection):
        [next_row] = connection.execute("SELECT value FROM meta WHERE name = 'next_row'").fetchone()
        first_row, passage_at, sentence_at = int(next_row), 0, 0
        for source, passages in documents:
            sentences = sum(len(passage.sentences) for passage in passages)
            cursor = connection.execute(
                "INSERT INTO documents (path, sha256, signature, characters, words, page_starts, passages, "
                "first_row, sentences, passage_vectors) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (document_path(source), source.sha256, _signature_json(source), len(source.text),
                 len(source.text.split()), json.dumps(source.page_starts),
                 json.dumps([[p.start, p.end, [list(s) for s in p.sentences]] for p in passages]), first_row,
                 sentences, passage_vectors[passage_at:passage_at + len(passages)].tobytes()))
            connection.execute("INSERT INTO sentence_vectors VALUES (?, ?)",
                               (cursor.lastrowid, sentence_vectors[sentence_at:sentence_at + sentences].tobytes()))
            add_rows(connection, first_row, sentence_texts[sentence_at:sentence_at + sentences])
            first_row, sentence_at = first_row + sentences, sentence_at + sentences
            passage_at += len(passages)
        connection.execute("UPDATE meta SET value = ? WHERE name = 'next_row'", (str(first_row),))


def _store_approximate(connection: sqlite3.Connection, dimension: int, folder: Path, progress: bool) -> None:
    """Makes the file's HNSW index (a file in `folder`) hold the passage vectors of its documents when
    they are APPROXIMATE_FROM or more (and removes it when fewer); nothing to do when it already does.
    `progress`: a bar of the passages added on stderr (a minute or so at 80,000)."""
    keys = [key for (key,) in connection.execute("SELECT id FROM documents ORDER BY id")]
    stored = connection.execute("SELECT documents, file, bytes FROM approximate").fetchone()
    if stored is not None and json.loads(stored[0]) == keys and _file_size(folder / stored[1]) == stored[2]:
        return
    [[passages]] = connection.execute("SELECT COALESCE(SUM(LENGTH(passage_vectors)), 0) FROM documents")
    passages //= 4 * dimension
    if passages < APPROXIMATE_FROM:
        if stored is not None:
            with _transaction(connection):
                connection.execute("DELETE FROM approximate")
            _remove_approximate_files(folder)
        return
    import faiss
    from tqdm.auto import tqdm

    index = faiss.IndexHNSWFlat(dimension, HNSW_NEIGHBOURS, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)  # threads add the vectors in an order of their own: another graph each run
    try:
        with tqdm(total=passages, desc="approximate index", unit=" passages", file=sys.stderr,
                  disable=not progress) as bar:
            def add(batch: list[np.ndarray]) -> None:
                index.add(np.concatenate(batch))
                bar.update(sum(len(vectors) for vectors in batch))

            batch: list[np.ndarray] = []
            for (blob,) in connection.execute("SELECT passage_vectors FROM documents ORDER BY id"):
                batch.append(np.frombuffer(blob, dtype=np.float32).reshape(-1, dimension))
                if sum(len(vectors) for vectors in batch) >= CHUNK_TEXTS:
                    add(batch)
                    batch = []
            if batch:
                add(batch)
    finally:
        faiss.omp_set_num_threads(threads)
    documents = json.dumps(keys)
    name = APPROXIMATE_FILE.format(hashlib.sha256(documents.encode()).hexdigest()[:32])
    serialized = faiss.serialize_index(index)
    atomic_write_bytes(folder / name, memoryview(serialized))  # no copy
    with _transaction(connection):
        connection.execute("DELETE FROM approximate")
        connection.execute("INSERT INTO approximate VALUES (?, ?, ?)", (documents, name, serialized.nbytes))
    _remove_approximate_files(folder, keep=name)


def _file_size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def index_corpus(sources: Sequence[SourceText], embedder, *, named_by: Sequence[str] | None = None,
                 cache_root: Path | None = None, progress: bool = True, max_tokens: int = MAX_TOKENS,
                 min_tokens: int = MIN_TOKENS, on_indexed: Callable[[SourceText, int], None] | None = None
                 ) -> "CorpusIndex":
    """The CorpusIndex of `sources`, from the index of the corpus named by `named_by` (the paths the
    user gave; None: the sources' own paths), brought up to date first (`CorpusStore.update`)."""
    return corpus_store(sources, embedder, named_by=named_by, cache_root=cache_root, max_tokens=max_tokens,
                        min_tokens=min_tokens).open(sources, embedder, progress=progress, on_indexed=on_indexed)


def read_corpus(paths: Sequence[str], embedder, *, cache_root: Path | None = None, max_tokens: int = MAX_TOKENS,
                min_tokens: int = MIN_TOKENS) -> tuple[list[SourceText], list[SourceError]]:
    """`load_sources(paths)`, but a file whose signature (size, times, inode) is the one the corpus
    index of `paths` recorded is not read: a question over an unchanged corpus reads only the files
    of the passages it uses, and their hashes are checked then."""
    settings = IndexSettings(embedder.key, max_tokens, min_tokens)
    return load_sources(paths, CorpusStore(corpus_folder(paths, settings, cache_root), settings).indexed_files())


def corpus_store(sources: Sequence[SourceText], embedder, *, named_by: Sequence[str] | None = None,
                 cache_root: Path | None = None, max_tokens: int = MAX_TOKENS,
                 min_tokens: int = MIN_TOKENS) -> CorpusStore:
    """The CorpusStore of the corpus named by `named_by` (None: the paths of `sources`)."""
    settings = IndexSettings(embedder.key, max_tokens, min_tokens)
    named = [source.path for source in sources] if named_by is None else list(named_by)
    return CorpusStore(corpus_folder(named, settings, cache_root), settings)


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


class PassagePlaces:
    """(document, passage) of each vector of an index that holds the passages of `documents` (indices
    into CorpusIndex.documents, in the index's order) in turn, `counts` of them each: found by a binary
    search rather than kept as a tuple a passage (a session opening 10,000 files built 80,000)."""

    def __init__(self, documents: Sequence[int], counts: Sequence[int]):
        self._documents = np.asarray(documents, dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(np.asarray(counts, dtype=np.int64))])

    def __len__(self) -> int:
        return int(self._starts[-1])

    def of(self, ids: np.ndarray) -> list[tuple[int, int]]:
        """The places of the vectors `ids` (each in [0, len)), all in one search: reading a whole
        corpus asks for every passage at once."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and not (0 <= ids.min() and ids.max() < len(self)):
            raise IndexError(f"vector ids {ids.min()}..{ids.max()} outside 0..{len(self) - 1}")
        places = np.searchsorted(self._starts, ids, side="right") - 1
        return list(zip(self._documents[places].tolist(), (ids - self._starts[places]).tolist()))


class CorpusIndex:
    """The documents of one session as an index file's snapshot holds them: their passages' vectors
    (searched exactly in a flat faiss index, documents in the order given, or through the file's HNSW
    index), their sentences' BM25 table (the file's, over exactly these documents) and their sentence
    vectors, read per document when first needed."""

    def __init__(self, connection: sqlite3.Connection, sources: Sequence[SourceText], changes: IndexChanges,
                 dimension: int, path: Path):
        """`connection`: inside the read transaction whose snapshot the corpus keeps, on the file `path`."""
        self.path = path
        self.connection, self.changes = connection, changes
        stored = {row[1]: row for row in connection.execute(
            "SELECT id, path, passages, first_row, LENGTH(passage_vectors), characters, words, sentences "
            "FROM documents")}
        self.documents = []
        for source in sources:
            found = stored.get(document_path(source))
            if found is None:
                raise DamagedIndex(f"{source.path} is not in the index")
            key, _, passages, first_row, vector_bytes, characters, words, sentences = found
            if vector_bytes % (4 * dimension):
                raise DamagedIndex(f"the passage vectors of {source.path} do not fit it")
            self.documents.append(DocumentIndex(source, passages, vector_bytes // (4 * dimension), key, first_row,
                                                words, sentences, characters))
        self.locations = PassagePlaces(range(len(self.documents)),
                                       [document.passage_count for document in self.documents])
        self.dimension = dimension
        self._exact: Any = None
        self._passage_vectors: dict[int, np.ndarray] = {}
        self.approximate = self._read_approximate(connection)
        self.lexical = LexicalIndex(connection)
        # A BM25 row -> its document (by first row) and that document's sentence -> its passage.
        order = sorted(range(len(self.documents)), key=lambda d: self.documents[d].first_row)
        self._first_rows = [self.documents[d].first_row for d in order]
        self._by_first_row = order
        self._sentence_vectors: dict[int, np.ndarray] = {}

    def _read_approximate(self, connection: sqlite3.Connection) -> tuple[Any, "PassagePlaces"] | None:
        """The file's HNSW index and the (document, passage) of each of its vectors; None when the file
        has none, or one over other documents than these."""
        row = connection.execute("SELECT documents, file FROM approximate").fetchone()
        if row is None:
            return None
        import faiss

        by_key = {document.key: d for d, document in enumerate(self.documents)}
        keys = json.loads(row[0])
        if sorted(keys) != sorted(by_key):
            return None
        try:
            # Mapped, not read: the pages a search visits are read as it visits them. The file is never
            # written again under its name (a new graph gets a new one) and outlives the mapping's reads.
            index = faiss.read_index(str(self.path.parent / row[1]), faiss.IO_FLAG_MMAP_IFC)
        except RuntimeError as error:
            raise DamagedIndex(f"its approximate index {row[1]} is unreadable ({str(error).splitlines()[0]})") from None
        order = [by_key[key] for key in keys]
        locations = PassagePlaces(order, [self.documents[d].passage_count for d in order])
        if index.ntotal != len(locations) or index.d != self.dimension:
            raise DamagedIndex(f"its approximate index holds {index.ntotal} vectors for {len(locations)} passages")
        index.hnsw.efSearch = HNSW_EF_SEARCH
        return index, locations

    def exact_index(self) -> Any:
        """The passage vectors in a flat (exact) faiss index, in the order of `locations`."""
        if self._exact is None:
            import faiss

            self._exact = faiss.IndexFlatIP(self.dimension)
            if self.locations:
                with self._reading():
                    by_key = {key: blob for key, blob in self.connection.execute(
                        "SELECT id, passage_vectors FROM documents")}
                    for d, document in enumerate(self.documents):
                        self._passage_vectors.setdefault(d, self._vectors_of(document, by_key.get(document.key)))
                self._exact.add(np.concatenate([self._passage_vectors[d] for d in range(len(self.documents))]))
        return self._exact

    def passage_vectors(self, d: int) -> np.ndarray:
        """The unit vectors of document d's passages, [passages, dimension], read when first asked for."""
        vectors = self._passage_vectors.get(d)
        if vectors is None:
            document = self.documents[d]
            with self._reading():
                row = self.connection.execute("SELECT passage_vectors FROM documents WHERE id = ?",
                                              (document.key,)).fetchone()
                vectors = self._passage_vectors[d] = self._vectors_of(document, None if row is None else row[0])
        return vectors

    def _vectors_of(self, document: DocumentIndex, blob: bytes | None) -> np.ndarray:
        vectors = np.frombuffer(blob or b"", dtype=np.float32)
        if vectors.size != document.passage_count * self.dimension:
            raise DamagedIndex(f"the passage vectors of {document.source.path} do not fit it")
        return vectors.reshape(document.passage_count, self.dimension)

    def search(self, vectors: np.ndarray, k: int, exact: bool = False) -> list[list[Hit]]:
        """The k nearest passages to each query vector, best first (scores: cosines); through the
        approximate index when the file has one and k is at most HNSW_EF_SEARCH, unless `exact`."""
        k = min(k, len(self.locations))
        if k == 0:
            return [[] for _ in range(len(vectors))]
        if self.approximate is not None and not exact and k <= HNSW_EF_SEARCH:
            index, locations = self.approximate
        else:
            index, locations = self.exact_index(), self.locations
        scores, ids = index.search(np.ascontiguousarray(vectors, dtype=np.float32), k)
        hits = []
        for row_scores, row_ids in zip(scores, ids):
            found = row_ids >= 0  # (faiss pads a row it could not fill with -1)
            hits.append([Hit(document, passage, score) for (document, passage), score
                         in zip(locations.of(row_ids[found]), row_scores[found].tolist())])
        return hits

    def _sentence_at(self, row: int) -> tuple[int, int] | None:
        """(document, its sentence) of a BM25 row; None for a row of no document of this corpus."""
        place = bisect.bisect_right(self._first_rows, row) - 1
        if place < 0:
            return None
        d = self._by_first_row[place]
        sentence = row - self.documents[d].first_row
        return (d, sentence) if sentence < self.documents[d].sentences else None

    def _ranked_sentences(self, words: Sequence[str], within: Sequence[str] | None) -> Iterator[tuple[int, int, float]]:
        """(document, sentence, BM25 score) of the rows holding one of `words` (`within`: holding one
        of these), best first (`longdoc.ask.lexical.LexicalIndex.rank`); equal scores in the order of
        the documents and their sentences (whatever rows the file gave them)."""
        tied: list[tuple[int, int, float]] = []
        for row, score in self.lexical.rank(words, within):
            found = self._sentence_at(row)
            if found is None:
                continue
            if tied and score != tied[0][2]:
                yield from sorted(tied)
                tied = []
            tied.append((*found, score))
        yield from sorted(tied)

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """Reads from the file, which another process may have damaged since the session opened it."""
        try:
            yield
        except DamagedIndex as error:
            # Rows SQLite reads, whose contents a session checks when it first uses them: opening the
            # file again would not find them damaged, so it goes.
            _remove_index_file(self.path)
            raise InputError(f"{self.path}: the corpus index is damaged ({error}): removed; the next longdoc ask, "
                             "index or serve with these paths rebuilds it") from None
        except sqlite3.DatabaseError as error:
            raise InputError(f"{self.path}: the corpus index was damaged while this session read it ({error}); "
                             "the next longdoc ask, index or serve with these paths rebuilds it") from None

    def search_text(self, text: str, k: int) -> list[Hit]:
        """The k best passages for `text` by the BM25 score of their best sentence, best first; only
        passages sharing a word with it. Exactly those, scoring only the sentences that can rank: the
        query's rarest words alone score a part of each sentence's score, so their k-th best passage
        bounds the k-th of all from below, and sentences holding only words whose BM25 together
        stays under that are not scored (`longdoc.ask.lexical.Query.needed_above`)."""
        with self._reading():
            query = self.lexical.query(text)
            probe, floor = query.rarest(PROBE_ROWS), 0.0
            if probe is not None:
                probed = self._best_passages(probe, k, None)
                floor = list(probed.values())[-1] if len(probed) == k else 0.0
            best = self._best_passages(query.words, k, query.needed_above(floor))
        return [Hit(d, p, score) for (d, p), score in best.items()]

    def _best_passages(self, words: Sequence[str], k: int, within: Sequence[str] | None
                       ) -> dict[tuple[int, int], float]:
        """(document, passage) -> BM25 score of its best sentence, for the k best, best first."""
        best: dict[tuple[int, int], float] = {}
        for d, sentence, score in self._ranked_sentences(words, within):
            if len(best) == k:
                break
            best.setdefault((d, self.documents[d].sentence_passages[sentence]), score)
        return best

    def sentence_vectors(self, hit: Hit) -> np.ndarray:
        """The unit vectors of the sentences of the hit's passage, [sentences, dimension]."""
        document = self.documents[hit.document]
        vectors = self._sentence_vectors.get(hit.document)
        if vectors is None:
            with self._reading():
                row = self.connection.execute("SELECT vectors FROM sentence_vectors WHERE document = ?",
                                              (document.key,)).fetchone()
                vectors = np.frombuffer(row[0] if row else b"", dtype=np.float32)
                sentences = document.sentences
                if vectors.size != sentences * self.dimension:
                    raise DamagedIndex(f"the sentence vectors of {document.source.path} do not fit it")
            vectors = self._sentence_vectors[hit.document] = vectors.reshape(sentences, self.dimension)
        passages = self.document_passages(hit.document)
        first = sum(len(passage.sentences) for passage in passages[:hit.passage])
        return vectors[first:first + len(passages[hit.passage].sentences)]

    def cosine(self, vector: np.ndarray, hit: Hit) -> float:
        return float(self.passage_vectors(hit.document)[hit.passage] @ vector)

    def document_passages(self, d: int) -> list[Passage]:
        """The passages of document `d` (parsed on first use, from the session's snapshot)."""
        with self._reading():
            return self.documents[d].passages

    def passage(self, hit: Hit) -> Passage:
        return self.document_passages(hit.document)[hit.passage]

    def text(self, hit: Hit) -> str:
        return self.documents[hit.document].passage_text(self.passage(hit))
