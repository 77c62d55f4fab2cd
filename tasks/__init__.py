"""The datasets longdoc knows: one package per dataset under tasks/ (installed as longdoc.tasks), each
defining `TASK`, its record (the contract: longdoc.data.task).

`REGISTRY` lists them explicitly (`BUILTIN_TASKS`, registered through the registry's decorator, which
refuses a name registered twice); a package is imported when its task is first asked for, so
listing the names, as `longdoc --help` does, imports none of them. Adding a dataset means adding its
package and its name here. The library never imports this package; the command line
(longdoc/cli.py, longdoc/commands/) hands `REGISTRY` to the library functions that look tasks up.
"""

import importlib
from typing import Callable

from longdoc.data.task import Task, TaskRegistry

BUILTIN_TASKS = ("hotpotqa", "multihop", "nq", "openkp", "wikihop")  # packages under tasks/, in this order

REGISTRY = TaskRegistry()


def _package_record(name: str) -> Callable[[], Task]:
    """A function that imports tasks/NAME and returns its TASK."""

    def record() -> Task:
        return importlib.import_module(f"{__name__}.{name}").TASK

    return record


for _name in BUILTIN_TASKS:
    REGISTRY.task(_name)(_package_record(_name))

get_task = REGISTRY.get
task_names = REGISTRY.names
register = REGISTRY.register
unregister = REGISTRY.unregister
