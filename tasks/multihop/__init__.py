"""The built-in multi-hop task (`longdoc make-data multihop`): generated long documents in the
HotpotQA distractor format, read, trained, decoded and scored by the HotpotQA task's pipeline (the
registry gives it that task's parts: `pipeline_of`), with its own name, data, configs and headline
metric (HotpotQA's options, e.g. `max_answer_length`, apply unchanged)."""

from pathlib import Path

from longdoc.data.task import Task

TASK = Task(
    name="multihop",
    description="generated bridge and yes/no comparison questions over long documents (HotpotQA format)",
    # Answer F1: the README's main job and scripts/bench_multihop.py compare models by it.
    headline_metric="f1",
    pipeline_of="hotpotqa",
    configs=Path(__file__).parent / "configs",
    extras={"generator": "longdoc.tasks.multihop.generator"},
)
