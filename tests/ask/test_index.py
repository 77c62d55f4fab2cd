"""Embeddings (as sentence-transformers computes them), the on-disk index cache (reused, refreshed
on change, rebuilt when damaged) and retrieval with the second hop over a long document."""

import hashlib

import numpy as np
import pytest

from longdoc.ask.documents import SourceText
from longdoc.ask.index import CorpusIndex, index_documents
from longdoc.ask.retrieve import RETRIEVERS, RetrievalOptions, Retriever, SentenceEvidence
from longdoc.tasks.multihop.generator import make_examples
from tests.ask.conftest import CountingEmbedder


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


def test_cache_is_reused_refreshed_on_change_and_rebuilt_when_damaged(embedder, tmp_path):
    counting = CountingEmbedder(embedder)
    text = "First paragraph about rivers.\n\nSecond paragraph about mountains. It has two sentences."
    [first] = index_documents([source(text)], counting, cache_root=tmp_path, progress=False)
    # (the short first paragraph joins the second: one passage)
    assert counting.embedded == len(first.passages) == 1
    [folder] = list(tmp_path.iterdir())
    [again] = index_documents([source(text)], counting, cache_root=tmp_path, progress=False)
    assert counting.embedded == 1 and again.passages == first.passages
    np.testing.assert_array_equal(again.vectors, first.vectors)

    index_documents([source(text + " Changed.")], counting, cache_root=tmp_path, progress=False)
    assert counting.embedded == 2

    (folder / "index.faiss").write_bytes(b"garbage")
    with pytest.warns(UserWarning, match="cached index .* is unusable .*hash.*rebuilding"):
        [rebuilt] = index_documents([source(text)], counting, cache_root=tmp_path, progress=False)
    assert counting.embedded == 3
    np.testing.assert_allclose(rebuilt.vectors, first.vectors, atol=1e-6)
    (folder / "meta.json").write_text("{not json", encoding="utf-8")
    with pytest.warns(UserWarning, match="unusable"):
        index_documents([source(text)], counting, cache_root=tmp_path, progress=False)
    assert counting.embedded == 4
    index_documents([source(text)], counting, cache_root=tmp_path, progress=False)
    assert counting.embedded == 4


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
    corpus = CorpusIndex(index_documents([source(text)], embedder, cache_root=tmp_path, progress=False))
    retriever = Retriever(corpus, embedder, SentenceEvidence(corpus, embedder))
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
