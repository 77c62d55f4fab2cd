"""Embeddings (as sentence-transformers computes them), the corpus index (reused, updated file by
file, rebuilt when damaged) and retrieval with the second hop over a long document."""

import hashlib
from pathlib import Path

import numpy as np
import pytest

from longdoc.ask.documents import SourceText
from longdoc.ask.index import INDEX_FILE, IndexChanges, index_corpus
from longdoc.ask.retrieve import RETRIEVERS, RetrievalOptions, Retriever, SentenceEvidence
from longdoc.tasks.multihop.generator import make_examples
from tests.ask.conftest import CountingEmbedder, indexed_texts


def source(text: str, path: str = "doc.txt") -> SourceText:
    return SourceText(path, text, hashlib.sha256(text.encode()).hexdigest(), False)


@pytest.mark.slow  # importing sentence-transformers takes seconds
def test_embeddings_equal_sentence_transformers(embedder):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    texts = ["Where is the employer of Alya Ivesson based?", "Zoë works for Corex Labs.", "word " * 300]
    reference = sentence_transformers.SentenceTransformer(str(embedder.path), device="cpu").encode(texts)
    ours = embedder.embed(texts)
    np.testing.assert_allclose(ours, reference, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)


def test_embeddings_and_wordpiece_counts_are_transformers_bertmodels_to_the_bit(embedder):
    # The cached indexes hold vectors computed with transformers' BertModel: the torch-only encoder
    # must give the same floats, padded batches, truncated texts and unpadded single texts alike.
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(embedder.path)
    model = AutoModel.from_pretrained(embedder.path).eval()
    texts = ["Where is the employer of Alya Ivesson based?", "Zoë works for Corex Labs. 東京, ça va", "",
             "word " * 300, "Orbix Group is based in Tallinnford."]
    for batch in (texts, texts[:1]):
        inputs = tokenizer(batch, padding=True, truncation=True, max_length=256, return_tensors="pt")
        with torch.inference_mode():
            hidden = model(**inputs).last_hidden_state
        mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        reference = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9), p=2, dim=1)
        order = sorted(range(len(batch)), key=lambda i: len(batch[i]), reverse=True)  # embed's batch order
        assert np.array_equal(embedder.embed([batch[i] for i in order]), reference.numpy()[order])
    assert embedder.count_tokens(texts) == [len(ids) for ids in
                                            tokenizer(texts, add_special_tokens=False)["input_ids"]]


def test_the_corpus_index_is_reused_updated_file_by_file_and_rebuilt_when_damaged(embedder, tmp_path):
    counting = CountingEmbedder(embedder)
    rivers = source("First paragraph about rivers.\n\nSecond paragraph about mountains. It has two sentences.",
                    "rivers.txt")
    bridges = source("Mara Quell paints bridges. She sells them in Ortorhaven.", "bridges.txt")

    def index(sources):
        return index_corpus(sources, counting, named_by=["docs"], cache_root=tmp_path, progress=False)

    first = index([rivers, bridges])
    first_vectors = first.passage_vectors(0)
    # (the short first paragraph joins the second: one passage of three sentences)
    assert [len(document.passages) for document in first.documents] == [1, 1]
    assert counting.embedded == indexed_texts(first.documents) == 2 + 3 + 2
    assert first.changes == IndexChanges(added=("rivers.txt", "bridges.txt"))
    [folder] = list((tmp_path / "corpus").iterdir())
    again = index([rivers, bridges])
    assert counting.embedded == 7 and again.changes == IndexChanges(kept=2)
    np.testing.assert_array_equal(again.passage_vectors(0), first_vectors)
    assert again.documents[0].passages == first.documents[0].passages

    changed = source(bridges.text + " Changed.", "bridges.txt")
    updated = index([rivers, changed])  # only the changed file is embedded again
    assert counting.embedded == 7 + 1 + 3 and updated.changes == IndexChanges(changed=("bridges.txt",), kept=1)
    with pytest.warns(UserWarning, match="rivers.txt: indexed before, and no longer among the documents .*dropped"):
        dropped = index([changed])
    assert counting.embedded == 11 and dropped.changes == IndexChanges(dropped=(str(Path("rivers.txt").resolve()),),
                                                                       kept=1)
    assert [document.source.path for document in dropped.documents] == ["bridges.txt"]
    assert len(dropped.search_text("rivers mountains paints", 10)) == 1  # the dropped file's rows are gone

    (folder / INDEX_FILE).write_bytes(b"garbage" * 1000)
    for suffix in ("-wal", "-shm"):
        (folder / (INDEX_FILE + suffix)).unlink(missing_ok=True)
    with pytest.warns(UserWarning, match=f"{INDEX_FILE}: the corpus index is unusable .*; rebuilding it"):
        rebuilt = index([rivers, changed])
    assert counting.embedded == 11 + 7 + 1
    np.testing.assert_allclose(rebuilt.passage_vectors(0), first_vectors, atol=1e-6)
    index([rivers, changed])
    assert counting.embedded == 19


def test_the_passage_at_the_far_end_of_a_long_document_is_retrieved(embedder, tmp_path):
    # About 20 times a 512-token encoder window of generated filler (full of "X is based in Y"
    # distractors), the fact asked for in its last paragraph.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(embedder.path)
    records = make_examples(5, seed=3, length=2200, min_distance=0, tokenizer=tokenizer, progress=False)
    filler = [title + "\n" + "".join(sentences) for r in records for title, sentences in r["context"]]
    text = "\n\n".join(["Quinoa Brightwell works for Pyraxis Foundry."] + filler
                       + ["Pyraxis Foundry is based in Ostmouth Harbour."])
    assert sum(embedder.count_tokens([text])) > 20 * 512
    corpus = index_corpus([source(text)], embedder, cache_root=tmp_path, progress=False)
    retriever = Retriever(corpus, embedder, SentenceEvidence(corpus))
    question = "Which city is Pyraxis Foundry based in?"
    for retrieval in ("minilm", "bm25", "hybrid"):
        for second_hop in (False, True):
            hits = _retrieve(retriever, question, RetrievalOptions(retrieval, passages=4, second_hop=second_hop))
            assert len(hits) == 4
            [last] = [hit for hit in hits if corpus.passage(hit).end == len(text)]
            assert corpus.text(last).endswith("Pyraxis Foundry is based in Ostmouth Harbour.")
            assert {rank.retriever for rank in last.found_by} <= set(RETRIEVERS[retrieval])
            # Scores are cosines with the question whichever ranking chose the passage.
            cosines = embedder.embed([corpus.text(hit) for hit in hits]) @ embedder.embed([question])[0]
            np.testing.assert_allclose([hit.score for hit in hits], cosines, atol=1e-5)


def _retrieve(retriever, question, options):
    return retriever.retrieve(question, retriever.question_vector(question), options)
