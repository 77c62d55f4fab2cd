"""WikiHop (QAngaroo v1.1)."""

from pathlib import Path

from longdoc.tasks import Option, Task

# The set every published row was measured on: the official dev file of QAngaroo v1.1.
FULL_DEV = {"set": "full dev", "files": ["dev.json"], "examples": 5129}

# Published dev accuracy: the RealFormer paper (He et al., 2020,
# arXiv:2012.11747) for its ETC-large baseline and ETC-large + RealFormer, the ETC paper (Ainslie
# et al., 2020, arXiv:2004.08483) for ETC-large.
REFERENCE_ROWS = (
    {"name": "ETC-large", "source": "RealFormer paper (He et al., 2020), dev", "measured_on": FULL_DEV,
     "metrics": {"accuracy": 0.7892}},
    {"name": "ETC-large + RealFormer", "source": "RealFormer paper (He et al., 2020), dev",
     "measured_on": FULL_DEV, "metrics": {"accuracy": 0.7921}},
    {"name": "ETC-large", "source": "ETC paper (Ainslie et al., 2020), dev", "measured_on": FULL_DEV,
     "metrics": {"accuracy": 0.798}},
)

TASK = Task(
    name="wikihop",
    description="choose the answer among candidates, reading many supporting documents",
    reader="longdoc.tasks.wikihop.reader",
    metric="longdoc.tasks.wikihop.metric",
    headline_metric="accuracy",
    reference_rows=REFERENCE_ROWS,
    train_options=(Option("max_question_len", int, 64, "query wordpieces kept"),),
    features="longdoc.tasks.wikihop.features",
    model="longdoc.tasks.wikihop.model:WikiHopModel",
    decode="longdoc.tasks.wikihop.decode",
    configs=Path(__file__).parent / "configs",
)
