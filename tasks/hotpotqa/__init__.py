"""HotpotQA (distractor setting)."""

from pathlib import Path

from longdoc.tasks import Option, Task

# The set every published row was measured on: the official dev file (distractor setting).
FULL_DEV = {"set": "full dev", "files": ["hotpot_dev_distractor_v1.json"], "examples": 7405}

# Published dev figures. The RealFormer paper (He et al., 2020,
# arXiv:2012.11747) reports joint F1 of its ETC-large baseline and of ETC-large + RealFormer; the
# ETC paper (Ainslie et al., 2020, arXiv:2004.08483) reports ETC-large's answer and support F1.
# Different papers, different runs: separate rows, never merged.
REFERENCE_ROWS = (
    {"name": "ETC-large", "source": "RealFormer paper (He et al., 2020), dev",
     "measured_on": FULL_DEV, "metrics": {"joint_f1": 0.7312}},
    {"name": "ETC-large + RealFormer", "source": "RealFormer paper (He et al., 2020), dev",
     "measured_on": FULL_DEV, "metrics": {"joint_f1": 0.7357}},
    {"name": "ETC-large", "source": "ETC paper (Ainslie et al., 2020), dev",
     "measured_on": FULL_DEV, "metrics": {"f1": 0.813, "sp_f1": 0.894}},
)

TASK = Task(
    name="hotpotqa",
    description="answer span / yes / no and supporting facts over ten Wikipedia paragraphs",
    reader="longdoc.tasks.hotpotqa.reader",
    metric="longdoc.tasks.hotpotqa.metric",
    headline_metric="joint_f1",
    reference_rows=REFERENCE_ROWS,
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
    features="longdoc.tasks.hotpotqa.features",
    model="longdoc.tasks.hotpotqa.model:HotpotQAModel",
    decode="longdoc.tasks.hotpotqa.decode",
    configs=Path(__file__).parent / "configs",
)
