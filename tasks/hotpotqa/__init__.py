"""HotpotQA (distractor setting). Published figures: published.json."""

from longdoc.options import Option
from longdoc.task import Task

TASK = Task.in_package(
    __name__, model_class="HotpotQAModel", headline_metric="joint_f1", ask=f"{__name__}.ask",
    description="answer span / yes / no and supporting facts over ten Wikipedia paragraphs",
    train_options=(
        Option("stride", int, 128, "overlap in wordpieces between windows of a context longer than long_max_len"),
        Option("max_question_len", int, 64, "question wordpieces kept"),
        Option("max_answer_length", int, 30, "longest answer span decoded, in wordpieces"),
        Option("sp_threshold", float, None,
               "supporting-fact probability threshold (default: the best joint F1 on --dev, else 0.5)"),
        Option("type_from_question", bool, False,
               "the answer-type head also reads the mean of the question's global tokens (ETC: CLS alone); "
               "learns yes/no questions from far fewer examples (the multihop bench config sets it)"),
    ),
)
