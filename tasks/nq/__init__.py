"""Natural Questions (original and simplified formats). Published figures: published.json."""

from dataclasses import dataclass

from longdoc.data.windows import WindowOptions
from longdoc.data.options import Option, option
from longdoc.data.task import Task


@dataclass(frozen=True)
class NQOptions(WindowOptions):
    max_question_len: int = option(32, "question wordpieces kept (ETC: 32)")
    max_short_answer_length: int = option(32, "longest short answer decoded, in wordpieces (ETC: 32)")
    # Options of reading a training file, not of the model: not stored in its config.
    null_window_keep_rate: float = option(0.1, "share of training windows without an answer that are kept (fixed "
                                               "draw per window)", stored=False)
    skip_bad_lines: bool = option(False, "skip and count input lines that do not parse, instead of stopping",
                                  stored=False)


TASK = Task.in_package(
    __name__, model_class="NQModel", headline_metric="long-best-threshold-f1",
    description="long and short answers over a whole Wikipedia page",
    metric_options=(
        # nq_eval.py's defaults: a gold answer exists when at least 2 of the 5 annotators gave one.
        Option("long_non_null_threshold", int, 2, "annotators needed for a gold long answer"),
        Option("short_non_null_threshold", int, 2, "annotators needed for a gold short answer"),
    ),
    options=NQOptions,
)
