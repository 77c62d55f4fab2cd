"""Which passages the reader reads: the nearest to the question, then a second hop.

A multi-hop question names only the start of its chain ("Where is the employer of A based?"): the
passage that answers it (about A's employer) shares few words with the question, so it is rarely
near the question itself. The second hop reads what the first found: for each of the best
`expand` first-hop passages, its sentence nearest to the question (the bridge sentence, "A works
for B.") is appended to the question, and the nearest passages to that new query join the
candidates (the query-plus-evidence construction of multi-hop dense retrieval, Xiong et al.,
2021, arXiv:2009.12756, with the untrained sentence model; one sentence rather than the whole
passage, so the bridge entity is not drowned by the passage's other sentences). The `expand` seed
passages stay; the other places go round the hops' ranked lists in turn (see `retrieve`).

Measured on the HotpotQA sample (scripts/bench_ask.py retrieval, README): the second hop raises how
often all gold supporting sentences are read (8 passages: 0.642 -> 0.717; 10: 0.717 -> 0.774;
6: 0.547 -> 0.623; 4: 0.509 -> 0.528) at the cost of one question's "any sentence" at 6 passages.
"""

from longdoc.ask.index import CorpusIndex, Hit

EXPAND = 3  # first-hop passages the second hop starts from


def retrieve(question: str, corpus: CorpusIndex, embedder, k: int, second_hop: bool = True,
             expand: int = EXPAND) -> list[Hit]:
    """The k passages to read, in the order chosen (the seeds first), with their retrieval scores."""
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
    # Each hop's list is ranked on its own: a query that repeats the question scores every passage
    # near the question higher than the bridge's answer passage, so comparing cosines across
    # queries lets the first hop's neighbours crowd out what the second hop found. The places left
    # after the seeds go round the lists in turn (each seed's second hop, then the first hop), each
    # list giving its best passage not yet chosen.
    def key(hit: Hit) -> tuple[int, int]:
        return hit.document, hit.passage

    chosen = {key(hit): hit for hit in seeds}
    lists = [iter(row) for row in corpus.search(embedder.embed(queries), k)] + [iter(hits)]
    while len(chosen) < k and lists:
        for row in list(lists):
            hit = next((hit for hit in row if key(hit) not in chosen), None)
            if hit is None:
                lists.remove(row)
            elif len(chosen) < k:
                chosen[key(hit)] = hit
    return list(chosen.values())


class SentenceEvidence:
    """The sentences of the passages read, ranked by how much they speak of a question (cosine with
    it): the best is the question's evidence (the no-answer rule of `longdoc.ask.session`), and the
    answers of sentence mode. Sentence vectors are computed once per passage and kept."""

    def __init__(self, corpus: CorpusIndex, embedder):
        self.corpus, self.embedder = corpus, embedder
        self.vectors = {}  # (document, passage) -> its sentences' unit vectors, [sentences, dimension]

    def ranked(self, question: str, hits: list[Hit]) -> list[tuple[float, Hit, tuple[int, int]]]:
        """(cosine with `question`, hit, character span) for every sentence of the passages `hits`, best
        first; the first cosine is the question's evidence."""
        missing = [hit for hit in hits if (hit.document, hit.passage) not in self.vectors]
        sentences = [self.corpus.passage(hit).sentences for hit in missing]
        vectors = self.embedder.embed([self.corpus.documents[hit.document].source.text[start:end]
                                       for hit, spans in zip(missing, sentences) for start, end in spans])
        first = 0
        for hit, spans in zip(missing, sentences):  # one batch for all, then each passage's rows
            self.vectors[(hit.document, hit.passage)] = vectors[first:first + len(spans)]
            first += len(spans)
        question_vector = self.embedder.embed([question])[0]
        scored = [(float(cosine), hit, span) for hit in hits
                  for cosine, span in zip(self.vectors[(hit.document, hit.passage)] @ question_vector,
                                          self.corpus.passage(hit).sentences)]
        return sorted(scored, key=lambda item: item[0], reverse=True)
