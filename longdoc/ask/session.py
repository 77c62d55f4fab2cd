"""An `ask` session: documents indexed once, then any number of questions answered over them.

`AskSession(sources, model_dir)` takes the documents `load_sources` read, indexes them (cached, `longdoc.ask.index`), loads the embedder and the reader
once; `ask(question)` retrieves (`longdoc.ask.retrieve`), reads (`longdoc.ask.reader`) and returns
the result object `longdoc ask --json` prints: {"question", "answers": [{"text", "score", "file", "start",
"end", "support": [...]}], "passages": [{"file", "start", "end", "score"}], "documents": [...]}.
"documents" says, per file, what its offsets count: the file's decoded text, or the text extracted
from its HTML; "evidence" is the cosine (MiniLM) between the question and the sentence of the
passages read nearest to it.

No answer: a question is refused ("answers" empty) when no sentence read is about it, that is when
"evidence" is under `min_evidence` (default MIN_EVIDENCE). The reader's span probability cannot
tell: the demo's model gives its document's answer whatever is asked (measured on 20 held-out
generated documents: an off-topic question got the document's own answer 71 times in 100, with the
same probability as the right question), while a question the document answers shares its
bridge sentence's words ("A works for B."). Calibration and held-out figures: README, `longdoc ask`.
"""

from pathlib import Path
from typing import Sequence

from longdoc.ask.documents import SourceText
from longdoc.ask.index import CorpusIndex, index_documents
from longdoc.ask.retrieve import SentenceEvidence, retrieve
from longdoc.convert.pretrained import cache_dir
from longdoc.errors import InputError

PASSAGES_READ = 8
MIN_EVIDENCE = 0.5  # calibrated on generated documents (README)


def default_model_dir() -> Path:
    """Where `longdoc demo` saves its trained multi-hop model, and `ask` looks by default."""
    return cache_dir() / "models" / "multihop"


def check_model_dir(model_dir=None) -> Path:
    """`model_dir` (default: `default_model_dir()`) when it exists; else InputError saying how to get one."""
    model_dir = Path(model_dir) if model_dir is not None else default_model_dir()
    if not model_dir.exists():
        raise InputError(
            f"{model_dir}: no trained model here; `longdoc ask` reads with a trained HotpotQA-style model: "
            "run `longdoc demo` (it trains one into this folder), or train one with `longdoc make-data "
            "multihop --n 480 --length 768 --min-distance 512 --comparison-fraction 0 --relation-share 0 "
            "--chain-order --seed 0 --out train.json && longdoc train multihop --config demo --long-max-len 768 "
            "--train train.json --out DIR` and pass --model DIR")
    return model_dir


class AskSession:
    def __init__(self, sources: Sequence[SourceText], model_dir=None, *, passages: int = PASSAGES_READ, second_hop: bool = True,
                 progress: bool = True, cache_root: Path | None = None):
        from longdoc.ask.embedding import SentenceEmbedder
        from longdoc.ask.reader import load_reader

        self.model_dir = check_model_dir(model_dir)
        self.model, self.tokenizer = load_reader(self.model_dir)
        self.sources = list(sources)
        self.embedder = SentenceEmbedder()
        self.corpus = CorpusIndex(index_documents(self.sources, self.embedder, cache_root=cache_root,
                                                  progress=progress))
        self.passages = passages
        self.evidence = SentenceEvidence(self.corpus, self.embedder)
        self.second_hop = second_hop
        # Retrieval is for what the encoder cannot read at once: documents that fit its long input
        # (beside the question) are read whole, every passage in file order, as the model was trained.
        corpus_texts = [document.passage_text(passage) for document in self.corpus.documents
                        for passage in document.passages]
        self.corpus_wordpieces = sum(len(ids) for ids in self.tokenizer(corpus_texts, add_special_tokens=False)["input_ids"])

    def reads_whole_corpus(self, question: str) -> bool:
        """Whether `[CLS] question [SEP] corpus [SEP]` fits the reader's long input."""
        question_wordpieces = len(self.tokenizer(question, add_special_tokens=False)["input_ids"])
        return self.corpus_wordpieces + question_wordpieces + 3 <= self.model.config.long_max_len

    def ask(self, question: str, top_k: int = 1, min_score: float | None = None,
            min_evidence: float | None = None) -> dict:
        """The result object for `question` (see the module docstring); `min_score`: the reader's
        (longdoc.ask.reader.MIN_SCORE when None); `min_evidence`: MIN_EVIDENCE when None."""
        from longdoc.ask.reader import MIN_SCORE, read_answers

        question = question.strip()
        passages = len(self.corpus.locations) if self.reads_whole_corpus(question) else self.passages
        hits = retrieve(question, self.corpus, self.embedder, passages, self.second_hop) if question else []
        evidence = self.evidence(question, hits) if hits else -1.0
        grounded = evidence >= (MIN_EVIDENCE if min_evidence is None else min_evidence)
        answers = read_answers(question, self.corpus, hits, self.model, self.tokenizer, top_k=top_k,
                               min_score=MIN_SCORE if min_score is None else min_score) if hits and grounded else []
        return {
            "question": question,
            "evidence": evidence,
            "answers": [answer.to_json() for answer in answers],
            "passages": [{"file": self.corpus.documents[hit.document].source.path,
                          "start": self.corpus.passage(hit).start, "end": self.corpus.passage(hit).end,
                          "score": hit.score} for hit in hits],
            "documents": [{"file": source.path, "sha256": source.sha256,
                           "offsets_into": "text extracted from HTML" if source.extracted else "decoded file text"}
                          for source in self.sources],
        }
