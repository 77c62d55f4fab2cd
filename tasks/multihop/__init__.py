"""The built-in multi-hop task (`longdoc make-data multihop`): generated long documents in the
HotpotQA distractor format, read, trained, decoded and scored by the HotpotQA task: its record
with another name, data, configs and headline metric (HotpotQA's own options, e.g.
`max_answer_length`, apply unchanged)."""

from dataclasses import replace
from pathlib import Path

from longdoc.tasks.hotpotqa import TASK as HOTPOTQA

TASK = replace(
    HOTPOTQA,
    name="multihop",
    description="generated bridge and yes/no comparison questions over long documents (HotpotQA format)",
    # Answer F1: the README's main job and scripts/bench_multihop.py compare models by it.
    headline_metric="f1",
    reference_rows=(),  # nothing published: the task is ours
    configs=Path(__file__).parent / "configs",
    extras={"generator": "longdoc.tasks.multihop.generator"},
)
