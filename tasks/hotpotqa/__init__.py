"""HotpotQA (distractor setting). Published figures: published.json."""

from dataclasses import dataclass

from longdoc.data.windows import WindowOptions
from longdoc.data.options import option
from longdoc.data.task import Task


@dataclass(frozen=True)
class HotpotQAOptions(WindowOptions):
    max_answer_length: int = option(30, "longest answer span decoded, in wordpieces")
    sp_threshold: float | None = option(None, "supporting-fact probability threshold (default: the best joint F1 "
                                              "on the dev file, else 0.5)")
    type_from_question: bool = option(False, "the answer-type head also reads the mean of the question's global "
                                             "tokens (ETC: CLS alone); learns yes/no questions from far fewer "
                                             "examples (the multihop bench config sets it)")


TASK = Task.in_package(
    __name__, model_class="HotpotQAModel", headline_metric="joint_f1", ask=f"{__name__}.ask",
    description="answer span / yes / no and supporting facts over ten Wikipedia paragraphs",
    options=HotpotQAOptions,
)
