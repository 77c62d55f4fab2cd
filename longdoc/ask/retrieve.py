"""Which passages the reader reads: a lexical and a dense ranking of the question, then a second hop.

Two retrievers rank the passages: BM25 over their words (`longdoc.ask.lexical`), which finds the one
passage that names a rare name among many that state the same relation for others, and MiniLM's
cosine (`longdoc.ask.index`), which finds passages that say what the question asks in other words.
Their rankings are fused by taking places in turn (`longdoc.ask.fusion.interleave`), so each
retriever's best passages are read whatever the other thinks of them.

A multi-hop question names only the start of its chain ("Where is the employer of A based?"): the
passage that answers it (about A's employer) shares few words with the question, so it is rarely
near the question itself. The second hop reads what the first found: for each of the best
`expand` first-hop passages, its sentence nearest to the question (the bridge sentence, "A works
for B.") is appended to the question, and both retrievers rank the passages for that new query
(the query-plus-evidence construction of multi-hop dense retrieval, Xiong et al., 2021,
arXiv:2009.12756, with the untrained sentence model; one sentence rather than the whole passage, so
the bridge entity is not drowned by the passage's other sentences; for BM25 the bridge adds the new
name, B, which the answer passage shares). The `expand` seed passages stay; the other places go
round the hops' fused rankings in turn.

How many passages: at least `least`, more while the rankings cannot tell their best apart: when
every retriever's first hop has many near-ties of its best score (`reading_budget`), enough places
to read one retriever's ties whole, at most `passages`.
"""

from dataclasses import dataclass

import numpy as np

from longdoc.ask.fusion import interleave, near_ties
from longdoc.ask.index import CorpusIndex, Hit, Rank

DENSE, LEXICAL = "minilm", "bm25"
RETRIEVERS = {"hybrid": (LEXICAL, DENSE), DENSE: (DENSE,), LEXICAL: (LEXICAL,)}
EXPAND = 3  # first-hop passages the second hop starts from
LEAST_PASSAGES = 8
MOST_PASSAGES = 32
TIE_TOLERANCE = 0.1  # a score within 10% of its ranking's best is a near-tie of it


@dataclass(frozen=True)
class RetrievalOptions:
    """`retrieval`: a key of RETRIEVERS; `passages`: the most passages read per question; `least`: the
    fewest (when `passages` allows); `second_hop`: rank again from the first passages' bridges."""
    retrieval: str = "hybrid"
    passages: int = MOST_PASSAGES
    least: int = LEAST_PASSAGES
    second_hop: bool = True
    expand: int = EXPAND

    def __post_init__(self):
        if self.retrieval not in RETRIEVERS:
            raise ValueError(f"retrieval must be one of {', '.join(RETRIEVERS)}, got {self.retrieval!r}")
        if self.passages < 1 or self.least < 1:
            raise ValueError(f"passages and least must be >= 1, got {self.passages} and {self.least}")


def _key(hit: Hit) -> tuple[int, int]:
    return hit.document, hit.passage


def reading_budget(rankings: dict[str, list[Hit]], least: int, most: int) -> int:
    """Passages to read: `least`, or, when every ranking's best is one of many near-ties, enough places
    (the rankings taking turns) to read the smallest such group whole; at most `most`."""
    ties = [near_ties([hit.score for hit in ranking], TIE_TOLERANCE) for ranking in rankings.values()]
    wanted = len(ties) * min(ties) if ties else 0
    return min(most, max(least, wanted))


class Retriever:
    """The rankings of one corpus: `retrieve(question, options)` gives the passages to read."""

    def __init__(self, corpus: CorpusIndex, embedder, evidence: "SentenceEvidence"):
        self.corpus, self.embedder, self.evidence = corpus, embedder, evidence

    def _rankings(self, queries: list[str], vectors: np.ndarray, retrievers: tuple[str, ...],
                  depth: int) -> list[dict[str, list[Hit]]]:
        """Per query, each retriever's best `depth` passages."""
        dense = self.corpus.search(vectors, depth) if DENSE in retrievers else None
        # Bridges repeat where documents share a sentence: each text is searched once.
        lexical = ({query: self.corpus.search_text(query, depth) for query in dict.fromkeys(queries)}
                   if LEXICAL in retrievers else {})
        return [{name: (lexical[query] if name == LEXICAL else dense[q]) for name in retrievers}
                for q, query in enumerate(queries)]

    def _bridges(self, question_vector: np.ndarray, hits: list[Hit]) -> list[str]:
        """The sentence of each hit's passage nearest to the question."""
        bridges = []
        for hit, vectors in zip(hits, self.evidence.sentence_vectors(hits)):
            start, end = self.corpus.passage(hit).sentences[int((vectors @ question_vector).argmax())]
            bridges.append(self.corpus.documents[hit.document].source.text[start:end])
        return bridges

    def question_vector(self, question: str) -> np.ndarray:
        """The question's unit vector (MiniLM), computed once per question by the caller and passed on."""
        return self.embedder.embed([question])[0]

    def everything(self, question_vector: np.ndarray) -> list[Hit]:
        """Every passage in file order, scored by its MiniLM cosine with the question (no ranking chose it)."""
        return sorted(self.corpus.search(question_vector[None], len(self.corpus.locations))[0], key=_key)

    def retrieve(self, question: str, question_vector: np.ndarray,
                 options: RetrievalOptions = RetrievalOptions()) -> list[Hit]:
        """The passages to read, in the order chosen (the seeds first); each hit's score is its MiniLM
        cosine with the question (`question_vector`), its `found_by` the rankings that placed it."""
        retrievers = RETRIEVERS[options.retrieval]
        [first] = self._rankings([question], question_vector[None], retrievers, options.passages)
        budget = reading_budget(first, min(options.least, options.passages), options.passages)
        fused = interleave([[_key(hit) for hit in ranking] for ranking in first.values()], budget)
        hops = [(1, first)]
        if options.second_hop and fused:
            seeds = fused[:options.expand]
            queries = [f"{question} {bridge}" for bridge in self._bridges(question_vector, [Hit(*seed, 0.0)
                                                                                          for seed in seeds])]
            second = self._rankings(queries, self.embedder.embed(queries) if DENSE in retrievers else None,
                                    retrievers, budget)
            lists = [interleave([[_key(hit) for hit in ranking] for ranking in rankings.values()], budget)
                     for rankings in second] + [fused]
            fused = seeds + interleave(lists, budget - len(seeds), taken=seeds)
            hops += [(2, rankings) for rankings in second]
        return [Hit(document, passage, self.corpus.cosine(question_vector, Hit(document, passage, 0.0)),
                    _found_by((document, passage), hops)) for document, passage in fused]


def _found_by(key: tuple[int, int], hops: list[tuple[int, dict[str, list[Hit]]]]) -> tuple[Rank, ...]:
    """The best place of `key` in each (hop, retriever)'s rankings, hop 1 first."""
    best: dict[tuple[int, str], int] = {}
    for hop, rankings in hops:
        for name, ranking in rankings.items():
            place = next((rank for rank, hit in enumerate(ranking, start=1) if _key(hit) == key), None)
            if place is not None and place < best.get((hop, name), place + 1):
                best[(hop, name)] = place
    return tuple(Rank(name, hop, rank) for (hop, name), rank in sorted(best.items()))


class SentenceEvidence:
    """The sentences of the passages read, ranked by how much they speak of a question (cosine with
    it): the best is the question's evidence (the no-answer rule of `longdoc.ask.session`), and the
    answers of sentence mode. The sentence vectors are the corpus index's, embedded when their
    document was indexed (the second hop's bridges use them too)."""

    def __init__(self, corpus: CorpusIndex):
        self.corpus = corpus

    def sentence_vectors(self, hits: list[Hit]) -> list[np.ndarray]:
        """Each hit's sentence vectors, [sentences, dimension]."""
        return [self.corpus.sentence_vectors(hit) for hit in hits]

    def ranked(self, question_vector: np.ndarray, hits: list[Hit]) -> list[tuple[float, Hit, tuple[int, int]]]:
        """(cosine with the question, whose unit vector is `question_vector`, hit, character span) for every
        sentence of the passages `hits`, best first; the first cosine is the question's evidence."""
        scored = [(float(cosine), hit, span) for hit, vectors in zip(hits, self.sentence_vectors(hits))
                  for cosine, span in zip(vectors @ question_vector, self.corpus.passage(hit).sentences)]
        return sorted(scored, key=lambda item: item[0], reverse=True)
