"""The flags tasks add to a command (`longdoc train TASK`, `longdoc evaluate TASK`): each option once,
with the tasks that take it, and a flag of another task refused for the task chosen."""

from typing import Callable, Iterable

from longdoc.errors import InputError
from longdoc.data.options import Option
from longdoc.data.task import Task
from longdoc.tasks import REGISTRY

OptionsOf = Callable[[Task], Iterable[Option]]  # a task's options of one kind: train_options, metric_options


def flags_by_task(options_of: OptionsOf) -> dict[str, tuple[Option, tuple[str, ...]]]:
    """{name: (the first task's option, the tasks that take it)}, in registry order."""
    found: dict[str, tuple[Option, tuple[str, ...]]] = {}
    for task in REGISTRY:
        for option in options_of(task):
            known, tasks = found.get(option.name, (option, ()))
            found[option.name] = (known, tasks + (task.name,))
    return found


def refuse_other_tasks_flags(args, task: Task, options_of: OptionsOf) -> None:
    """InputError naming the flags given on the command line that `task` does not take."""
    own = {option.name for option in options_of(task)}
    foreign = [option for option, _ in flags_by_task(options_of).values()
               if option.name not in own and getattr(args, option.name) is not None]
    if foreign:
        raise InputError(f"{', '.join(option.flag for option in foreign)} does not apply to the {task.name} task")
