"""HotpotQA (distractor setting)."""

from longdoc.tasks import Task

# Published dev figures. The RealFormer paper (He et al., 2020,
# arXiv:2012.11747) reports joint F1 of its ETC-large baseline and of ETC-large + RealFormer; the
# ETC paper (Ainslie et al., 2020, arXiv:2004.08483) reports ETC-large's answer and support F1.
# Different papers, different runs: separate rows, never merged.
REFERENCE_ROWS = (
    {"name": "ETC-large", "source": "RealFormer paper (He et al., 2020), dev",
     "metrics": {"joint_f1": 0.7312}},
    {"name": "ETC-large + RealFormer", "source": "RealFormer paper (He et al., 2020), dev",
     "metrics": {"joint_f1": 0.7357}},
    {"name": "ETC-large", "source": "ETC paper (Ainslie et al., 2020), dev",
     "metrics": {"f1": 0.813, "sp_f1": 0.894}},
)

TASK = Task(
    name="hotpotqa",
    description="answer span / yes / no and supporting facts over ten Wikipedia paragraphs",
    reader="longdoc.tasks.hotpotqa.reader",
    metric="longdoc.tasks.hotpotqa.metric",
    headline_metric="joint_f1",
    reference_rows=REFERENCE_ROWS,
)
