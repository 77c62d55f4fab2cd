"""Hybrid retrieval over real MiniLM embeddings and the real BM25 index: the lexical rows in the
corpus index (written once, reused), what `ask --json` says about why a passage was read, and the
edges: no word of the question in the documents, a one-sentence corpus."""

import hashlib
import json

import pytest

from benchmarks.readers import make_fact_questions
from longdoc.ask.documents import SourceText
from longdoc.ask.index import INDEX_FILE, LOCK_FILE, index_corpus
from longdoc.ask.retrieve import RetrievalOptions, Retriever, SentenceEvidence
from longdoc.cli import main
from tests.ask.conftest import CountingEmbedder
from tests.conftest import new_cache


@pytest.fixture(scope="module")
def document():
    """About 3,000 words (60 passages) of filler and 40 "P was born in C." facts, paragraphs of 6 sentences."""
    return make_fact_questions(1, seed=5, words=3000, distractors=40)[0]


def source(text: str, path: str = "doc.txt") -> SourceText:
    return SourceText(path, text, hashlib.sha256(text.encode()).hexdigest(), False)


def _retriever(document, embedder, cache, indexing_embedder=None):
    corpus = index_corpus([source(document.context)], indexing_embedder or embedder, cache_root=cache, progress=False)
    return corpus, Retriever(corpus, embedder, SentenceEvidence(corpus))


def _holding(corpus, hits, offset):
    return [hit for hit in hits if corpus.passage(hit).start <= offset < corpus.passage(hit).end]


def test_the_lexical_rows_are_written_once_and_reused(embedder, document, tmp_path):
    counting = CountingEmbedder(embedder)
    corpus, retriever = _retriever(document, embedder, tmp_path, counting)
    [folder] = list((tmp_path / "corpus").iterdir())
    embedded = counting.embedded
    rows = corpus.connection.execute("SELECT count(*) FROM sentences").fetchone()[0]
    assert rows == sum(len(passage.sentences) for passage in corpus.documents[0].passages)
    question = "Where was {} born?".format(document.facts[0][0])
    expected = [hit.passage for hit in _retrieve(retriever, question, RetrievalOptions(retrieval="bm25"))]
    assert _holding(corpus, corpus.search_text(question, 1), document.answer_start)
    written = (folder / INDEX_FILE).stat().st_mtime_ns

    corpus, retriever = _retriever(document, embedder, tmp_path, counting)  # reused: nothing embedded or written
    assert counting.embedded == embedded and (folder / INDEX_FILE).stat().st_mtime_ns == written
    assert [hit.passage for hit in _retrieve(retriever, question, RetrievalOptions(retrieval="bm25"))] == expected


@pytest.mark.slow  # 82 retrievals
def test_a_fact_that_minilm_ranks_among_near_ties_is_read_because_bm25_ranks_it_first(embedder, document, tmp_path):
    corpus, retriever = _retriever(document, embedder, tmp_path)
    misses = 0
    for person, city in document.facts:  # 41 "P was born in C." facts in 63 passages, 8 read
        fact = document.context.index(f"{person} was born in {city}.")
        question = f"Where was {person} born?"
        [hybrid] = _holding(corpus, _retrieve(retriever, question, RetrievalOptions(passages=8, second_hop=False)), fact)
        assert hybrid.found_by[0].to_json() == {"retriever": "bm25", "hop": 1, "rank": 1}
        dense = _retrieve(retriever, question, RetrievalOptions(retrieval="minilm", passages=8, second_hop=False))
        misses += not _holding(corpus, dense, fact)
    assert misses >= 3  # what the lexical ranking is for: MiniLM alone misses some of them (6 when written)


def test_json_says_which_rankings_chose_each_passage_and_answer(document, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LONGDOC_CACHE", str(new_cache(tmp_path / "cache")))
    path = tmp_path / "facts.txt"
    path.write_text(document.context, encoding="utf-8")
    question = f"Where was {document.facts[0][0]} born?"
    assert main(["ask", "--question", question, "--json", str(path)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["read"] == "retrieved" and 8 <= len(result["passages"]) <= 32
    answer = result["answers"][0]
    assert answer["text"] == f"{document.facts[0][0]} was born in {document.answer}."
    assert answer["found_by"][0] == {"retriever": "bm25", "hop": 1, "rank": 1}
    [holding] = [p for p in result["passages"] if p["start"] <= answer["start"] < p["end"]]
    assert holding["found_by"] == answer["found_by"]
    for passage in result["passages"]:
        assert passage["found_by"] and all(rank["retriever"] in ("bm25", "minilm") and rank["hop"] in (1, 2)
                                           and rank["rank"] >= 1 for rank in passage["found_by"])


def test_a_question_with_no_word_the_documents_hold(document, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LONGDOC_CACHE", str(new_cache(tmp_path / "cache")))
    path = tmp_path / "facts.txt"
    path.write_text(document.context, encoding="utf-8")
    results = {}
    for retrieval in ("hybrid", "bm25"):
        assert main(["ask", "--question", "Qwzx vbnmk plorf?", "--json", "--retrieval", retrieval, str(path)]) == 0
        results[retrieval] = json.loads(capsys.readouterr().out)
    assert results["bm25"]["passages"] == [] and results["bm25"]["answers"] == []  # nothing to read
    hybrid = results["hybrid"]
    assert hybrid["answers"] == [] and hybrid["evidence"] < 0.5  # MiniLM's passages read, and refused
    ranks = [rank for passage in hybrid["passages"] for rank in passage["found_by"]]
    # BM25 matches nothing for the question (its second hop may, for the bridge sentence MiniLM found).
    assert ranks and not [rank for rank in ranks if rank["retriever"] == "bm25" and rank["hop"] == 1]
    assert main(["ask", "--question", "Qwzx vbnmk plorf?", str(path)]) == 0
    assert capsys.readouterr().out == "no answer found\n"


def test_a_corpus_of_one_sentence(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LONGDOC_CACHE", str(new_cache(tmp_path / "cache")))
    path = tmp_path / "one.txt"
    path.write_text("Mara Quell was born in Tallinnford.", encoding="utf-8")
    for retrieval in ("hybrid", "bm25", "minilm"):
        assert main(["ask", "--question", "Where was Mara Quell born?", "--json", "--retrieval", retrieval,
                     str(path)]) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["read"] == "all"
        assert [(a["text"], a["start"], a["end"]) for a in result["answers"]] == [
            ("Mara Quell was born in Tallinnford.", 0, 35)]
        assert [(p["start"], p["end"]) for p in result["passages"]] == [(0, 35)]
    [folder] = list((tmp_path / "cache" / "ask" / "corpus").iterdir())
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(INDEX_FILE + "-")) == sorted(
        [INDEX_FILE, LOCK_FILE])


def _retrieve(retriever, question, options):
    return retriever.retrieve(question, retriever.question_vector(question), options)


def test_the_question_is_embedded_once_and_passed_to_retrieval_and_evidence(document, tmp_path, monkeypatch):
    from longdoc.ask.embedding import SentenceEmbedder
    from longdoc.ask.session import AskSession

    session = AskSession([source(document.context)], progress=False, cache_root=tmp_path)
    embedded, embed = [], SentenceEmbedder.embed
    monkeypatch.setattr(SentenceEmbedder, "embed",
                        lambda self, texts, progress=None: embedded.append(list(texts)) or embed(self, texts, progress))
    question = f"Where was {document.facts[0][0]} born?"
    for read_all in (False, True):  # retrieved (two hops), then every passage
        assert session.answer(question, read_all=read_all).answers
    assert [texts for texts in embedded if question in texts] == [[question], [question]]
