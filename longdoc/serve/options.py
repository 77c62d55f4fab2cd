"""`POST /api/ask`'s body: a question and `longdoc ask`'s options by their long names (the names
argparse gives `--top-k`, `--passages`, ...: top_k, passages, ...), as one validated record.

Unknown names are refused (422 naming them), so a misspelt option is never silently ignored;
values are checked as `longdoc ask` checks its flags (at least 1 answer, passage, wordpiece).
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from longdoc.ask.session import MAX_QUESTION_CHARS, MIN_EVIDENCE, PASSAGES_READ, question_problem


class AskOptions(BaseModel):
    """One question and how to answer it; defaults as `longdoc ask`'s."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    question: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS, description="the question")
    top_k: int = Field(1, ge=1, description="answers to return")
    passages: int = Field(PASSAGES_READ, ge=1, description="passages retrieved and read when the documents are "
                                                            "longer than the reader reads at once")
    retrieval: Literal["hybrid", "bm25", "minilm"] = Field("hybrid", description="the rankings that choose the "
                                                                             "passages (BM25 and MiniLM in turn, or one)")
    read_all: bool = Field(False, description="read every passage instead of retrieving")
    second_hop: bool = Field(True, description="retrieve again with the question and the sentence nearest to it in "
                                               "the best passages (false: the question only)")
    min_score: float | None = Field(None, description="drop span answers that score lower (null: 0.05 for a trained "
                                                      "task model, none dropped for a QA reader)")
    min_evidence: float | None = Field(None, description=f"refuse when no sentence read has this cosine (MiniLM) with "
                                                         f"the question (null: {MIN_EVIDENCE}; -1 answers everything)")
    max_answer_len: int | None = Field(None, ge=1, description="a QA reader's longest answer in wordpieces "
                                                               "(null: the reader's)")
    handle_impossible_answer: bool = Field(False, description="a SQuAD 2.0 reader may answer nothing")

    @field_validator("question")
    @classmethod
    def _askable(cls, question: str) -> str:
        problem = question_problem(question)
        if problem is not None:
            raise ValueError(problem)
        return question
