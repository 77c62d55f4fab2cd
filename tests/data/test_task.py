"""The Task record and registry (longdoc.data.task): a task running another's pipeline gets its parts and
keeps its own name, data and figures; unknown names list the known ones; a task's options record
gives its flags."""

from pathlib import Path

import pytest

from longdoc.data.windows import WindowOptions
from longdoc.data.task import Task, TaskRegistry


def registry() -> TaskRegistry:
    tasks = TaskRegistry()
    tasks.register(Task(name="base", description="a task", headline_metric="f1", reader="base.reader",
                        metric="base.metric", model="base.model:Model", options=WindowOptions,
                        reference_rows=({"name": "paper"},)))

    @tasks.task("generated")
    def generated() -> Task:  # as tasks/__init__.py registers a package
        return Task(name="generated", description="generated data", headline_metric="em", pipeline_of="base",
                    configs=Path("configs"), extras={"generator": "gen"})

    return tasks


def test_a_task_running_another_pipeline_takes_its_parts_and_keeps_its_own_data():
    task = registry().get("generated")
    assert (task.reader, task.metric, task.model, task.options) == ("base.reader", "base.metric", "base.model:Model",
                                                                   WindowOptions)
    assert (task.name, task.headline_metric, task.reference_rows, task.extras) == ("generated", "em", (),
                                                                                  {"generator": "gen"})
    assert [option.name for option in task.train_options] == ["stride", "max_question_len"]
    assert task.default_options() == WindowOptions()


def test_names_in_registration_order_unknown_names_listed_and_self_reference_refused():
    tasks = registry()
    assert tasks.names() == ["base", "generated"] and [task.name for task in tasks] == ["base", "generated"]
    with pytest.raises(KeyError, match="unknown task 'other'; known tasks: base, generated"):
        tasks.get("other")
    tasks.register(Task(name="loop", description="", headline_metric="f1", pipeline_of="loop"))
    with pytest.raises(ValueError, match="task 'loop' names itself in pipeline_of"):
        tasks.get("loop")
    tasks.unregister("loop")
    with pytest.raises(KeyError):
        tasks.unregister("loop")
