"""The built-in multi-hop task (`longdoc make-data multihop`): generated long documents in the
HotpotQA distractor format, read, trained, decoded and scored by the HotpotQA parts (named here
by module path, so this package imports none of them)."""

from pathlib import Path

from longdoc.tasks import Task

TASK = Task(
    name="multihop",
    description="generated bridge and yes/no comparison questions over long documents (HotpotQA format)",
    reader="longdoc.tasks.hotpotqa.reader",
    metric="longdoc.tasks.hotpotqa.metric",
    # Answer F1: the README's main job and scripts/bench_multihop.py compare models by it.
    headline_metric="f1",
    features="longdoc.tasks.hotpotqa.features",
    model="longdoc.tasks.hotpotqa.model:HotpotQAModel",
    decode="longdoc.tasks.hotpotqa.decode",
    configs=Path(__file__).parent / "configs",
    extras={"generator": "longdoc.tasks.multihop.generator"},
)
