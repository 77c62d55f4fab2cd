"""Natural Questions (original and simplified formats). Published figures: published.json."""

from longdoc.options import Option
from longdoc.task import Task

TASK = Task.in_package(
    __name__, model_class="NQModel", headline_metric="long-best-threshold-f1",
    description="long and short answers over a whole Wikipedia page",
    metric_options=(
        # nq_eval.py's defaults: a gold answer exists when at least 2 of the 5 annotators gave one.
        Option("long_non_null_threshold", int, 2, "annotators needed for a gold long answer"),
        Option("short_non_null_threshold", int, 2, "annotators needed for a gold short answer"),
    ),
    train_options=(
        Option("stride", int, 128, "overlap in wordpieces between consecutive windows of a document"),
        Option("max_question_len", int, 32, "question wordpieces kept (ETC: 32)"),
        Option("max_short_answer_length", int, 32, "longest short answer decoded, in wordpieces (ETC: 32)"),
        Option("null_window_keep_rate", float, 0.1,
               "share of training windows without an answer that are kept (fixed draw per window)"),
        Option("skip_bad_lines", bool, False, "skip and count input lines that do not parse, instead of stopping"),
    ),
)
