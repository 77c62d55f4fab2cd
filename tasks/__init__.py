"""The datasets longdoc knows: one package per dataset under tasks/ (installed as longdoc.tasks), each
defining `TASK`, its record (the contract: longdoc.task).

`REGISTRY` lists them explicitly, one decorated function per task that imports its package when the
task is first asked for: listing the names, as `longdoc --help` does, imports none of them. Adding a
dataset means adding its package here and one such function. The library never imports this
package; the command line (longdoc/cli.py, longdoc/commands/) hands `REGISTRY` to the library
functions that look tasks up.
"""

from longdoc.task import Task, TaskRegistry

REGISTRY = TaskRegistry()


@REGISTRY.task("hotpotqa")
def _hotpotqa() -> Task:
    from longdoc.tasks.hotpotqa import TASK

    return TASK


@REGISTRY.task("multihop")
def _multihop() -> Task:
    from longdoc.tasks.multihop import TASK

    return TASK


@REGISTRY.task("nq")
def _nq() -> Task:
    from longdoc.tasks.nq import TASK

    return TASK


@REGISTRY.task("openkp")
def _openkp() -> Task:
    from longdoc.tasks.openkp import TASK

    return TASK


@REGISTRY.task("wikihop")
def _wikihop() -> Task:
    from longdoc.tasks.wikihop import TASK

    return TASK


get_task = REGISTRY.get
task_names = REGISTRY.names
register = REGISTRY.register
unregister = REGISTRY.unregister
