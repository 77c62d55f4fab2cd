"""Natural Questions (original and simplified formats)."""

from longdoc.tasks import Option, Task

REFERENCE_ROWS = (
    {
        "name": "ETC-large",
        "source": "ETC (Ainslie et al., 2020), NQ dev",
        "metrics": {"long-best-threshold-f1": 0.782, "short-best-threshold-f1": 0.585},
    },
    {
        "name": "ETC-large (RealFormer baseline)",
        "source": "RealFormer (He et al., 2020), NQ dev",
        "metrics": {"long-best-threshold-f1": 0.7770, "short-best-threshold-f1": 0.5854},
    },
    {
        "name": "ETC-large + RealFormer",
        "source": "RealFormer (He et al., 2020), NQ dev",
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
)
