"""The corpus index as users meet it: updated file by file to the answers a fresh index gives,
`longdoc index` stopped by kill -9 or Ctrl-C and run again to the contents of an uninterrupted run,
two processes indexing one corpus at once (the second saying it waits, --quiet or not), a file deleted
between indexing and asking, an index damaged while a session reads it, and a corpus large enough
for the approximate vector index (the size lowered)."""

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.ask import approximate_recall, write_generated_corpus
from benchmarks.readers import make_fact_questions
from longdoc.ask import index as index_module
from longdoc.ask.documents import SourceText, load_sources
from longdoc.ask.index import INDEX_FILE, IndexChanges, PassagePlaces, corpus_store, index_corpus
from longdoc.ask.retrieve import RetrievalOptions, Retriever, SentenceEvidence
from longdoc.cli import main
from longdoc.errors import InputError
from tests.ask.conftest import CountingEmbedder, damage_index, indexed_texts
from tests.conftest import SHARED_DATA


def test_passage_places_are_found_in_the_order_the_index_holds_the_documents():
    # An index holding documents 2, 0 and 1 in turn, with 2, 0 and 3 passages: vector 2 is document 1's
    # first passage (document 0, with none, takes no vector).
    places = PassagePlaces([2, 0, 1], [2, 0, 3])
    assert len(places) == 5
    assert places.of([4, 0, 2, 1, 3]) == [(1, 2), (2, 0), (1, 0), (2, 1), (1, 1)]
    assert places.of([]) == []
    for outside in ([5], [-1], [0, 7]):
        with pytest.raises(IndexError):
            places.of(outside)


def source(text: str, path: str) -> SourceText:
    return SourceText(path, text, hashlib.sha256(text.encode()).hexdigest(), False)


def _answers(corpus, embedder, questions):
    """Per question and retrieval: the passages read (with their scores and rankings) and the evidence ranking."""
    retriever = Retriever(corpus, embedder, SentenceEvidence(corpus))
    evidence = SentenceEvidence(corpus)
    found = []
    for question in questions:
        vector = retriever.question_vector(question)
        for retrieval in ("hybrid", "bm25", "minilm"):
            hits = retriever.retrieve(question, vector, RetrievalOptions(retrieval, passages=6))
            found.append([(corpus.documents[hit.document].source.path, hit.passage, hit.score, hit.found_by)
                          for hit in hits])
            found.append([(score, corpus.documents[hit.document].source.path, span)
                          for score, hit, span in evidence.ranked(vector, hits)])
    return found


def test_an_index_updated_file_by_file_answers_as_a_fresh_one(embedder, tmp_path, monkeypatch):
    # One document a chunk, so that a document's vectors are the same floats however it came to be indexed.
    monkeypatch.setattr(index_module, "CHUNK_TEXTS", 1)
    facts = make_fact_questions(4, seed=11, words=300, distractors=6)
    sources = [source(fact.context, f"facts{number}.txt") for number, fact in enumerate(facts)]
    changed = source(facts[1].context + "\n\nOrla Fenwick was born in Quarrytown.", "facts1.txt")
    added = source("Ivo Brand was born in Tallinnford. He sold boats.", "added.txt")
    counting = CountingEmbedder(embedder)
    updated = tmp_path / "updated"
    index_corpus(sources, counting, named_by=["docs"], cache_root=updated, progress=False)
    before = counting.embedded
    final = [sources[0], changed, sources[3], added]  # facts2 removed, facts1 changed, added.txt new
    with pytest.warns(UserWarning, match="facts2.txt: indexed before.*dropped from the index"):
        incremental = index_corpus(final, counting, named_by=["docs"], cache_root=updated, progress=False)
    assert incremental.changes == IndexChanges(added=("added.txt",), changed=("facts1.txt",),
                                               dropped=(str(Path("facts2.txt").resolve()),), kept=2)
    fresh = index_corpus(final, embedder, named_by=["docs"], cache_root=tmp_path / "fresh", progress=False)
    # Only the changed and the new file were embedded: their passages and sentences.
    assert counting.embedded - before == indexed_texts(fresh.documents[1::2])
    questions = [f"Where was {fact.facts[0][0]} born?" for fact in facts] + [
        "Where was Orla Fenwick born?", "Who sold boats?", "Which city is mentioned?"]
    assert _answers(incremental, embedder, questions) == _answers(fresh, embedder, questions)
    for question in questions:  # BM25 over exactly the documents asked: the same scores
        assert incremental.search_text(question, 50) == fresh.search_text(question, 50)


# `longdoc index` with chunks of about 6 texts (two of these documents), stopped by SIGNAL (or not: "none")
# as the AFTER-th document's BM25 rows are written, inside its chunk's transaction.
INDEXING = """
import signal, sys
import longdoc.ask.index as index
index.CHUNK_TEXTS, index.APPROXIMATE_FROM = 6, 10  # 12 passages: the HNSW index built as well
stop, after = sys.argv[1], int(sys.argv[2])
real, calls = index.add_rows, [0]
def add_rows(*args):
    real(*args)
    calls[0] += 1
    if calls[0] == after and stop != "none":
        signal.raise_signal(getattr(signal, stop))  # to this thread: the main one, whose handler raises
index.add_rows = add_rows
from longdoc.cli import main
sys.exit(main(sys.argv[3:]))
"""


def _documents(folder: Path, count: int = 12) -> Path:
    folder.mkdir(parents=True)
    for number in range(count):
        (folder / f"note{number:02}.txt").write_text(
            f"Person {number} lives in town {number}. They keep {number} goats. The goats are white.\n",
            encoding="utf-8")
    return folder


def _index(documents: Path, cache: Path, stop: str = "none", after: int = 0, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", INDEXING, stop, str(after), "index", str(documents)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "LONGDOC_CACHE": str(cache)}, **kwargs)


def _finished(process: subprocess.Popen) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=300)
    return process.returncode, out, err


def _contents(cache: Path) -> dict:
    """Every table's rows, but the files' signatures (whether one is recorded depends on how long ago
    the file was written when it was read, the racy window, not on what was indexed), and the bytes of
    every other file in the index's folder but its lock."""
    [path] = cache.glob(f"ask/corpus/*/{INDEX_FILE}")
    with sqlite3.connect(path) as connection:
        documents = ", ".join(name for _, name, *_ in connection.execute("PRAGMA table_info(documents)")
                              if name != "signature")
        tables = {table: connection.execute(f"SELECT {columns} FROM {table} ORDER BY 1").fetchall()
                  for table, columns in (("meta", "*"), ("documents", documents), ("sentence_vectors", "*"),
                                         ("sentences", "rowid, body"), ("approximate", "*"))}
    return {**tables, "files": {file.name: file.read_bytes() for file in sorted(path.parent.iterdir())
                                if not file.name.startswith((INDEX_FILE, "lock"))}}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The documents and the contents of their index written by one uninterrupted `longdoc index`."""
    root = tmp_path_factory.mktemp("uninterrupted")
    documents = _documents(root / "docs")
    status, out, err = _finished(_index(documents, root / "cache"))
    assert status == 0, err
    assert "12 files indexed (12 new, 0 changed), 0 unchanged" in out
    contents = _contents(root / "cache")
    assert len(contents["documents"]) == 12 and len(contents["sentences"]) == 36
    assert len(contents["approximate"]) == 1 and list(contents["files"]) == [contents["approximate"][0][1]]
    return documents, contents


@pytest.mark.parametrize("stop", ["SIGKILL", "SIGINT"])
def test_an_indexing_killed_or_interrupted_and_run_again_ends_as_an_uninterrupted_one(uninterrupted, tmp_path,
                                                                                    stop):
    documents, expected = uninterrupted
    cache = tmp_path / "cache"
    # Stopped inside the third chunk, after its first document's rows: two chunks (four files) committed.
    status, out, err = _finished(_index(documents, cache, stop, after=5))
    if stop == "SIGKILL":
        assert status == -9
    else:
        assert status == 130 and "Traceback" not in err, (status, out, err)
        assert err.splitlines()[-1] == (f"longdoc index: interrupted; 4 of the files indexed by this run are kept in "
                                        f"{next(cache.glob('ask/corpus/*/' + INDEX_FILE))}; running it again goes "
                                        "on from them")
    assert len(_contents(cache)["documents"]) == 4
    status, out, err = _finished(_index(documents, cache))
    assert status == 0, err
    assert "8 files indexed (8 new, 0 changed), 4 unchanged" in out  # nothing indexed twice
    assert _contents(cache) == expected


def test_two_processes_indexing_one_corpus_take_turns(uninterrupted, tmp_path):
    documents, expected = uninterrupted
    cache = tmp_path / "cache"
    first = _index(documents, cache)
    second = _index(documents, cache)
    results = [_finished(first), _finished(second)]
    assert [status for status, _, _ in results] == [0, 0], [err for _, _, err in results]
    outs = sorted(out for _, out, _ in results)
    assert "12 files indexed (12 new, 0 changed), 0 unchanged" in outs[0] and "nothing changed" in outs[1]
    assert _contents(cache) == expected


def test_a_file_deleted_between_indexing_and_asking_is_dropped_with_a_warning(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LONGDOC_CACHE", str(tmp_path / "cache"))
    documents = _documents(tmp_path / "docs", count=3)
    assert main(["index", str(documents)]) == 0
    (documents / "note01.txt").unlink()
    (documents / "note02.txt").write_text("Person 2 moved to Ortorhaven.\n", encoding="utf-8")
    capsys.readouterr()
    with pytest.warns(UserWarning, match=f"^{documents / 'note01.txt'}: indexed before, and no longer among the "
                                         "documents .*: dropped from the index$"):
        assert main(["ask", "--json", "--question", "Where does Person 2 live?", str(documents)]) == 0
    captured = capsys.readouterr()
    assert "longdoc ask: index updated: 1 file indexed (0 new, 1 changed), 1 dropped, 1 unchanged" in captured.err
    result = json.loads(captured.out)
    assert [document["file"] for document in result["documents"]] == [str(documents / "note00.txt"),
                                                                       str(documents / "note02.txt")]
    text = (documents / "note02.txt").read_text(encoding="utf-8")
    [answer] = result["answers"]
    assert answer["file"] == str(documents / "note02.txt")
    assert text[answer["start"]:answer["end"]] == answer["text"] == "Person 2 moved to Ortorhaven."


def test_many_unreadable_files_among_readable_ones_are_each_named_once_counted_and_the_rest_answered(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LONGDOC_CACHE", str(tmp_path / "cache"))
    documents = _documents(tmp_path / "docs", count=2)
    bad = [documents / f"blob{number:02}.txt" for number in range(40)] + [documents / "blank.md"]
    for path in bad[:-1]:
        path.write_bytes(b"\x00binary")
    bad[-1].write_text(" \n", encoding="utf-8")
    for command in (["index"], ["ask", "--json", "--question", "Where does Person 1 live?"]):
        assert main([*command, str(documents)]) == 0, command  # answered from the two readable files
        err = capsys.readouterr().err.splitlines()
        named = [line for line in err if line.startswith(f"longdoc {command[0]}: error: ")]
        assert sorted(named) == sorted(f"longdoc {command[0]}: error: {path}: " + (
            "empty file (no text)" if path.suffix == ".md" else "binary file (contains NUL bytes), not text")
            for path in bad)
        going_on = "indexing" if command[0] == "index" else "answering from"
        assert f"longdoc {command[0]}: 41 paths could not be read (named above); {going_on} the 2 files read" in err
    for path in documents.glob("note*.txt"):
        path.unlink()
    assert main(["ask", "--question", "Where does Person 1 live?", str(documents)]) == 2  # nothing to answer from
    err = capsys.readouterr().err
    assert err.count("error: ") == 41 and "could not be read (named above)" not in err


def test_a_corpus_of_many_passages_searches_a_stored_hnsw_index_close_to_exact(embedder, tmp_path, monkeypatch):
    import faiss

    monkeypatch.setattr(index_module, "APPROXIMATE_FROM", 40)
    monkeypatch.setattr(index_module, "HNSW_EF_SEARCH", 16)  # a narrow search, so that it can miss
    hotpotqa = SHARED_DATA / "hotpotqa" / "hotpot_dev_distractor_v1.first53.json"
    write_generated_corpus(hotpotqa, tmp_path / "docs", 30, words=160)
    sources, errors = load_sources([tmp_path / "docs"])
    assert not errors
    corpus = index_corpus(sources, embedder, named_by=["docs"], cache_root=tmp_path, progress=False)
    assert len(corpus.locations) >= 40 and corpus.approximate is not None
    questions = [record["question"] for record in json.loads(hotpotqa.read_text(encoding="utf-8"))]
    vectors = embedder.embed(questions)
    assert approximate_recall(corpus, vectors) >= 0.98
    searched = corpus.search(vectors, 8)
    folder = next(tmp_path.glob("corpus/*"))
    [graph] = folder.glob("hnsw-*.faiss")
    # The graph's file lost, or a file of the version that kept the graph in a table: the next update
    # builds it again (on one thread: the same graph).
    graph.unlink()
    assert index_corpus(sources, embedder, named_by=["docs"], cache_root=tmp_path,
                        progress=False).search(vectors, 8) == searched
    with sqlite3.connect(folder / INDEX_FILE) as connection:
        connection.execute("DROP TABLE approximate")
        connection.execute("CREATE TABLE approximate (documents TEXT NOT NULL, hnsw BLOB NOT NULL)")
        connection.execute("INSERT INTO approximate VALUES ('[]', x'00')")
    graph.unlink()
    assert index_corpus(sources, embedder, named_by=["docs"], cache_root=tmp_path,
                        progress=False).search(vectors, 8) == searched
    # Its bytes damaged: the index is rebuilt, with a warning naming it.
    graph.write_bytes(b"\x00" * graph.stat().st_size)
    with pytest.warns(UserWarning, match=f"{INDEX_FILE}: the corpus index is unusable .*{graph.name} is unreadable"):
        assert index_corpus(sources, embedder, named_by=["docs"], cache_root=tmp_path,
                            progress=False).search(vectors, 8) == searched
    # Stored beside the file: a session maps the graph and builds none.
    monkeypatch.setattr(faiss, "IndexHNSWFlat", None)
    again = index_corpus(sources, embedder, named_by=["docs"], cache_root=tmp_path, progress=False)
    assert again.approximate is not None and again.search(vectors, 8) == searched
    assert again.search(vectors, 17) == again.search(vectors, 17, exact=True)  # beyond the search width: exact
    # Fewer passages than the size after files are dropped: no graph left, exact search.
    with pytest.warns(UserWarning, match="dropped from the index"):
        fewer = index_corpus(sources[:10], embedder, named_by=["docs"], cache_root=tmp_path, progress=False)
    assert fewer.approximate is None and len(fewer.locations) < 40
    with sqlite3.connect(folder / INDEX_FILE) as connection:
        assert connection.execute("SELECT COUNT(*) FROM approximate").fetchone() == (0,)
    assert not list(folder.glob("*hnsw*"))


def test_an_index_damaged_while_a_session_reads_it_ends_the_question_with_an_error_naming_it(embedder, tmp_path):
    facts = make_fact_questions(3, seed=5, words=200, distractors=4)
    sources = [source(fact.context, f"facts{number}.txt") for number, fact in enumerate(facts)]
    corpus_store(sources, embedder, named_by=["docs"], cache_root=tmp_path).update(sources, embedder, progress=False)
    corpus = index_corpus(sources, embedder, named_by=["docs"], cache_root=tmp_path, progress=False)  # a session
    path = next(tmp_path.glob(f"corpus/*/{INDEX_FILE}"))
    assert corpus.path == path
    damage_index(path)
    question = f"Where was {facts[0].facts[0][0]} born?"
    with pytest.raises(InputError, match=f"^{path}: the corpus index was damaged while this session read it "
                                         r"\(.*\); the next longdoc ask, index or serve with these paths rebuilds it$"):
        Retriever(corpus, embedder, SentenceEvidence(corpus)).retrieve(question, embedder.embed([question])[0])
    corpus.connection.close()
    with pytest.warns(UserWarning, match=f"^{path}: the corpus index is unusable .*; rebuilding it$"):
        rebuilt = index_corpus(sources, embedder, named_by=["docs"], cache_root=tmp_path, progress=False)
    assert len(rebuilt.documents) == 3


def test_passages_damaged_in_a_sound_file_end_the_question_and_the_file_is_rebuilt(embedder, tmp_path):
    # A session parses a document's passages when it first uses them: damage SQLite does not see is
    # found then, not when the file is opened.
    facts = make_fact_questions(3, seed=5, words=200, distractors=4)
    sources = [source(fact.context, f"facts{number}.txt") for number, fact in enumerate(facts)]
    corpus_store(sources, embedder, named_by=["docs"], cache_root=tmp_path).update(sources, embedder, progress=False)
    path = next(tmp_path.glob(f"corpus/*/{INDEX_FILE}"))
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE documents SET passages = '[[0, 5' WHERE path = ?", (sources[0].resolved_path,))
    connection.close()
    corpus = index_corpus(sources, embedder, named_by=["docs"], cache_root=tmp_path, progress=False)
    hit = next(hit for hit in corpus.search(embedder.embed([facts[0].context[:200]]), 8, exact=True)[0]
               if hit.document == 0)
    with pytest.raises(InputError, match=f"^{path}: the corpus index is damaged \\(the passages of facts0.txt are "
                                         r"unreadable \(.*\)\): removed; the next longdoc ask, index or serve "
                                         r"with these paths rebuilds it$"):
        corpus.text(hit)
    corpus.connection.close()
    assert not path.exists()
    counting = CountingEmbedder(embedder)
    rebuilt = index_corpus(sources, counting, named_by=["docs"], cache_root=tmp_path, progress=False)
    assert counting.embedded == indexed_texts(rebuilt.documents)  # every document embedded again
    assert rebuilt.text(hit) == sources[0].text[rebuilt.passage(hit).start:rebuilt.passage(hit).end]


def test_a_second_indexer_says_once_that_it_waits_even_when_quiet(tmp_path):
    import fcntl
    import select

    documents = _documents(tmp_path / "docs", count=2)
    cache = tmp_path / "cache"
    status, _, err = _finished(_index(documents, cache))
    assert status == 0, err
    (documents / "note00.txt").write_text("Person 0 moved to Ortorhaven.\n", encoding="utf-8")
    [lock_path] = cache.glob("ask/corpus/*/lock")
    with open(lock_path, "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as another indexer holds it
        waiting = subprocess.Popen([sys.executable, "-m", "longdoc.cli", "--quiet", "index", str(documents)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env={**os.environ, "LONGDOC_CACHE": str(cache)})
        ready, _, _ = select.select([waiting.stderr], [], [], 120)  # MiniLM loads first
        said = waiting.stderr.readline() if ready else "(nothing said in 120 s)"
    status, out, rest = _finished(waiting)
    assert said == (f"longdoc: {lock_path.parent / INDEX_FILE}: another process is updating this corpus index; "
                    "waiting for it\n")
    assert status == 0 and "waiting" not in rest and "1 file indexed (0 new, 1 changed), 1 unchanged" in out


def test_an_unchanged_corpus_is_asked_without_reading_its_files_and_a_changed_file_is_still_noticed(
        embedder, tmp_path, monkeypatch):
    from types import SimpleNamespace

    from longdoc.ask import documents as documents_module
    from longdoc.ask.index import read_corpus

    documents = tmp_path / "docs"
    documents.mkdir()
    for number, town in enumerate(["Brackenford", "Lowmere", "Ortorhaven"]):
        (documents / f"note{number:02}.txt").write_text(f"Person {number} moved to {town}. They keep goats.\n",
                                                        encoding="utf-8")
    assert documents_module.file_signature(os.stat(documents / "note00.txt")) is None  # just written: racy
    # Ten seconds on: the files are older than the racy window, as a corpus asked again usually is.
    now = documents_module.time.time_ns
    monkeypatch.setattr(documents_module, "time", SimpleNamespace(time_ns=lambda: now() + 10_000_000_000))
    read = []
    real_read_source = documents_module.read_source
    monkeypatch.setattr(documents_module, "read_source", lambda path: read.append(path.name) or real_read_source(path))
    counting = CountingEmbedder(embedder)

    def ask_again():
        read.clear()
        sources, errors = read_corpus([str(documents)], counting, cache_root=tmp_path / "cache")
        assert not errors
        files = list(read)
        corpus = index_corpus(sources, counting, named_by=[str(documents)], cache_root=tmp_path / "cache",
                              progress=False)
        return files, corpus

    files, corpus = ask_again()
    assert files == ["note00.txt", "note01.txt", "note02.txt"] and corpus.changes.describe().startswith("3 files")
    embedded = counting.embedded
    files, corpus = ask_again()
    assert files == [] and corpus.changes.describe() is None  # the signatures recorded: nothing read
    [hit] = corpus.search_text("Ortorhaven", 1)
    assert corpus.text(hit).startswith("Person 2") and read == ["note02.txt"]  # a passage used: its file alone

    # Touched, the same bytes: hashed once, not indexed again, then trusted again.
    os.utime(documents / "note01.txt")
    files, corpus = ask_again()
    assert files == ["note01.txt"] and corpus.changes.describe() is None and counting.embedded == embedded
    assert ask_again()[0] == []

    # Changed to as many bytes, its modification time set back: its change time (set by any write and by
    # os.utime, never back) still differs, so it is hashed and indexed again.
    status = os.stat(documents / "note02.txt")
    text = (documents / "note02.txt").read_text(encoding="utf-8")
    (documents / "note02.txt").write_text(text.replace("Ortorhaven", "Ortorhavem"), encoding="utf-8")
    os.utime(documents / "note02.txt", ns=(status.st_atime_ns, status.st_mtime_ns))
    assert os.stat(documents / "note02.txt").st_size == status.st_size
    files, corpus = ask_again()
    assert files == ["note02.txt"]
    assert corpus.changes.describe() == "1 file indexed (0 new, 1 changed), 2 unchanged"
    assert counting.embedded > embedded

    # Changed after the question trusted its signature: its text is refused when used, never a stale offset.
    read.clear()
    sources, _ = read_corpus([str(documents)], counting, cache_root=tmp_path / "cache")
    corpus = index_corpus(sources, counting, named_by=[str(documents)], cache_root=tmp_path / "cache", progress=False)
    assert read == []
    (documents / "note02.txt").write_text("Person 2 moved away.\n", encoding="utf-8")
    [hit] = corpus.search_text("Ortorhavem", 1)
    with pytest.raises(InputError, match=f"^{documents / 'note02.txt'}: changed while this question was answered"):
        corpus.text(hit)


class _WordCountEmbedder:
    """Passages split by whitespace words and vectors of no meaning: what the lexical ranking's test
    needs of an embedder, cheaply (BM25 reads no vector)."""

    key, dimension = "word-count-test", 8

    def count_tokens(self, texts):
        return [len(text.split()) for text in texts]

    def embed(self, texts, progress=None):
        import numpy as np

        vectors = np.random.default_rng(len(texts)).standard_normal((len(texts), self.dimension)).astype(np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_the_lexical_ranking_scoring_only_the_sentences_that_can_rank_is_the_ranking_scoring_all(tmp_path,
                                                                                                 monkeypatch):
    hotpotqa = SHARED_DATA / "hotpotqa" / "hotpot_dev_distractor_v1.first53.json"
    write_generated_corpus(hotpotqa, tmp_path / "docs", 40, words=300)
    records = json.loads(hotpotqa.read_text(encoding="utf-8"))
    # Questions, and questions with a sentence as a second hop's queries are: many words, common ones too.
    texts = [record["question"] for record in records] + [
        f"{record['question']} {record['context'][0][1][0]}" for record in records]
    # And short sentences of only each text's two most common words, each six times: sentences the
    # bound must let rank (they score close to it).
    lexical = index_corpus(load_sources([tmp_path / "docs"])[0], _WordCountEmbedder(), cache_root=tmp_path,
                           progress=False).lexical
    common = [sorted(zip(query.rows, query.words), reverse=True)[:2] for query in map(lexical.query, texts)]
    (tmp_path / "docs" / "common.txt").write_text(
        "\n\n".join(" ".join([word.strip('"') for _, word in words] * 6) + "." for words in common))
    sources, errors = load_sources([tmp_path / "docs"])
    corpus = index_corpus(sources, _WordCountEmbedder(), cache_root=tmp_path, progress=False)
    scored = []
    monkeypatch.setattr(corpus.lexical, "rank", lambda words, within=None: scored.append(within) or
                        type(corpus.lexical).rank(corpus.lexical, words, within))
    for k in (1, 3, 8):
        monkeypatch.setattr(index_module, "PROBE_ROWS", 10 ** 9)  # every word in the probe: all rows scored
        scored.clear()
        every = [corpus.search_text(text, k) for text in texts]
        assert all(within is None for within in scored)
        monkeypatch.setattr(index_module, "PROBE_ROWS", 20)
        scored.clear()
        assert [corpus.search_text(text, k) for text in texts] == every
        assert sum(within is not None for within in scored) > len(texts) / 4, k  # many searches left rows out
