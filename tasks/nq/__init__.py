"""Natural Questions (original and simplified formats)."""

from pathlib import Path

from longdoc.tasks import Option, Task

# The set every published row was measured on: the official dev shards.
FULL_DEV = {"set": "full dev", "files": [f"nq-dev-0{shard}.jsonl.gz" for shard in range(5)], "examples": 7830}

REFERENCE_ROWS = (
    {
        "name": "ETC-large",
        "source": "ETC (Ainslie et al., 2020), NQ dev",
        "measured_on": FULL_DEV,
        "metrics": {"long-best-threshold-f1": 0.782, "short-best-threshold-f1": 0.585},
    },
    {
        "name": "ETC-large (RealFormer baseline)",
        "source": "RealFormer (He et al., 2020), NQ dev",
        "measured_on": FULL_DEV,
        "metrics": {"long-best-threshold-f1": 0.7770, "short-best-threshold-f1": 0.5854},
    },
    {
        "name": "ETC-large + RealFormer",
        "source": "RealFormer (He et al., 2020), NQ dev",
        "measured_on": FULL_DEV,
        "metrics": {"long-best-threshold-f1": 0.7793, "short-best-threshold-f1": 0.5910},
    },
)

TASK = Task(
    name="nq",
    description="long and short answers over a whole Wikipedia page",
    reader="longdoc.tasks.nq.reader",
    metric="longdoc.tasks.nq.metric",
    headline_metric="long-best-threshold-f1",
    reference_rows=REFERENCE_ROWS,
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
    features="longdoc.tasks.nq.features",
    model="longdoc.tasks.nq.model:NQModel",
    decode="longdoc.tasks.nq.decode",
    configs=Path(__file__).parent / "configs",
)
