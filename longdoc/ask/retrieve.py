"""Which passages the reader reads: the nearest to the question, then a second hop.

A multi-hop question names only the start of its chain ("Where is the employer of A based?"): the
passage that answers it (about A's employer) shares few words with the question, so it is rarely
near the question itself. The second hop reads what the first found: for each of the best
`expand` first-hop passages, its sentence nearest to the question (the bridge sentence, "A works
for B.") is appended to the question, and the nearest passages to that new query join the
candidates (the query-plus-evidence construction of multi-hop dense retrieval, Xiong et al.,
2021, arXiv:2009.12756, with the untrained sentence model; one sentence rather than the whole
passage, so the bridge entity is not drowned by the passage's other sentences). The `expand` seed
passages stay; the other places go to the best remaining candidates, a candidate scoring the
best of its first-hop cosine and its second-hop cosines.

Measured on the HotpotQA sample (scripts/bench_ask.py retrieval, README): the second hop raises how
often all gold supporting sentences are read (8 passages: 0.642 -> 0.660; 10: 0.717 -> 0.755;
4: 0.509 -> 0.566) at the cost of one question's "any sentence" at 6 passages.
"""

from longdoc.ask.index import CorpusIndex, Hit

EXPAND = 3  # first-hop passages the second hop starts from


def retrieve(question: str, corpus: CorpusIndex, embedder, k: int, second_hop: bool = True,
             expand: int = EXPAND) -> list[Hit]:
    """The k passages to read, best first, with their retrieval scores."""
    question_vector = embedder.embed([question])[0]
    hits = corpus.search(question_vector[None], k)[0]
    if not second_hop or not hits:
        return hits
    seeds = hits[:expand]
    bridges = []
    for hit in seeds:
        passage, document = corpus.passage(hit), corpus.documents[hit.document]
        sentences = [document.source.text[start:end] for start, end in passage.sentences]
        nearest = int((embedder.embed(sentences) @ question_vector).argmax())
        bridges.append(sentences[nearest])
    queries = [f"{question} {sentence}" for sentence in bridges]
    best = {(hit.document, hit.passage): hit for hit in hits}
    for row in corpus.search(embedder.embed(queries), k):
        for hit in row:
            key = (hit.document, hit.passage)
            if key not in best or hit.score > best[key].score:
                best[key] = hit
    kept = {(hit.document, hit.passage) for hit in seeds}
    ranked = sorted(best.values(), key=lambda hit: hit.score, reverse=True)
    rest = [hit for hit in ranked if (hit.document, hit.passage) not in kept]
    chosen = [best[(hit.document, hit.passage)] for hit in seeds] + rest[:max(0, k - len(seeds))]
    return sorted(chosen, key=lambda hit: hit.score, reverse=True)

