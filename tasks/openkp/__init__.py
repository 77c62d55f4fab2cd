"""OpenKP (MS MARCO keyphrase extraction)."""

from pathlib import Path

from longdoc.tasks import Option, Task

# The set every published row was measured on: the official dev file.
FULL_DEV = {"set": "full dev", "files": ["OpenKPDev.jsonl"], "examples": 6616}

# Published dev F1@3: the RealFormer paper (He et al., 2020,
# arXiv:2012.11747) for its ETC-large baseline and ETC-large + RealFormer, the ETC paper (Ainslie
# et al., 2020, arXiv:2004.08483) for ETC-large.
REFERENCE_ROWS = (
    {"name": "ETC-large", "source": "RealFormer paper (He et al., 2020), dev", "measured_on": FULL_DEV,
     "metrics": {"F1@3": 0.4406}},
    {"name": "ETC-large + RealFormer", "source": "RealFormer paper (He et al., 2020), dev",
     "measured_on": FULL_DEV, "metrics": {"F1@3": 0.4427}},
    {"name": "ETC-large", "source": "ETC paper (Ainslie et al., 2020), dev", "measured_on": FULL_DEV,
     "metrics": {"F1@3": 0.423}},
)

TASK = Task(
    name="openkp",
    description="keyphrases of a web page, with its visual DOM",
    reader="longdoc.tasks.openkp.reader",
    metric="longdoc.tasks.openkp.metric",
    headline_metric="F1@3",
    reference_rows=REFERENCE_ROWS,
    train_options=(
        Option("stride", int, 128, "overlap in wordpieces between windows of a page longer than long_max_len"),
    ),
    features="longdoc.tasks.openkp.features",
    model="longdoc.tasks.openkp.model:OpenKPModel",
    decode="longdoc.tasks.openkp.decode",
    configs=Path(__file__).parent / "configs",
)
