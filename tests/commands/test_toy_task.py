"""A fifth dataset needs its own package and its line in the registry: a toy task, written here into
a temporary folder, is registered (as a record, or as a package under tasks/ with the registry's
decorator) and scored by `longdoc evaluate` with its own flag."""

import importlib
import json
import sys

import pytest

from longdoc import cli
from longdoc import tasks as task_registry
from longdoc.data.options import Option
from longdoc.data.task import Task

TOY_READER = '''
"""Toy reader: one JSON object {id: number} per file."""
import json


def read_examples(path):
    yield from json.loads(open(path, encoding="utf-8").read()).items()
'''

TOY_METRIC = '''
"""Toy metric: the share of gold ids whose predicted number is within `tolerance` of the gold one."""
from longdoc.evaluate.ids import check_prediction_ids

from .reader import read_examples


def evaluate_files(gold_path, pred_path, *, tolerance, allow_missing=False):
    gold, predicted = dict(read_examples(gold_path)), dict(read_examples(pred_path))
    check_prediction_ids(pred_path, gold_path, predicted.keys() - gold.keys(), {"prediction": gold.keys() - predicted.keys()},
                         allow_missing=allow_missing)
    hits = sum(key in predicted and abs(predicted[key] - value) <= tolerance for key, value in gold.items())
    return {"within_tolerance": hits / len(gold)}
'''

TOY_OPTION = Option("tolerance", float, 0.0, "largest accepted distance from the gold number")

# The whole of tasks/numbers/__init__.py, as a user adding a dataset would write it.
TOY_INIT = '''
from longdoc.data.options import Option
from longdoc.data.task import Task

TASK = Task(name="numbers", description="numbers within a tolerance", reader="longdoc.tasks.numbers.reader",
            metric="longdoc.tasks.numbers.metric", headline_metric="within_tolerance",
            metric_options=(Option("tolerance", float, 0.0, "largest accepted distance from the gold number"),))
'''


def toy_task(package: str, name: str = "numbers") -> Task:
    return Task(name=name, description="numbers within a tolerance", reader=f"{package}.reader",
                metric=f"{package}.metric", headline_metric="within_tolerance", metric_options=(TOY_OPTION,))


def write_package(folder, package: str, init: str = "") -> None:
    (folder / package).mkdir()
    for module, text in (("__init__", init), ("reader", TOY_READER), ("metric", TOY_METRIC)):
        (folder / package / f"{module}.py").write_text(text)


@pytest.fixture
def clean_registry(monkeypatch):
    """The registry as the built-in tasks leave it, restored afterwards; so are the imported modules."""
    names_before = set(task_registry.task_names())  # the built-in tasks first, so only the toy is undone
    monkeypatch.setattr(cli, "COMMANDS", {"evaluate": "longdoc.commands.evaluate"})
    modules_before = set(sys.modules)
    yield
    for name in set(task_registry.task_names()) - names_before:
        task_registry.unregister(name)
    for name in set(sys.modules) - modules_before:
        if name.startswith(("toy_registered", "longdoc.tasks.numbers")):
            del sys.modules[name]


@pytest.fixture
def files(tmp_path):
    gold = tmp_path / "gold.json"
    pred = tmp_path / "pred.json"
    gold.write_text(json.dumps({"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}))
    pred.write_text(json.dumps({"a": 1.0, "b": 2.4, "c": 3.6, "d": 9.0}))  # d is far off
    return ["--gold", str(gold), "--pred", str(pred), "--json"]


def test_a_registered_task_is_evaluated_with_its_own_flag(clean_registry, tmp_path, monkeypatch, files, capsys):
    write_package(tmp_path, "toy_registered")
    monkeypatch.syspath_prepend(str(tmp_path))
    task_registry.register(toy_task("toy_registered"))
    assert cli.main(["evaluate", "numbers", *files]) == 0
    assert json.loads(capsys.readouterr().out) == {"within_tolerance": 1 / 4}  # default 0.0: only a
    assert cli.main(["evaluate", "numbers", *files, "--tolerance", "0.5"]) == 0
    assert json.loads(capsys.readouterr().out) == {"within_tolerance": 2 / 4}  # a and b
    # The toy's flag belongs to the toy: another task refuses it.
    assert cli.main(["evaluate", "wikihop", *files, "--tolerance", "0.5"]) == 2
    assert "--tolerance does not apply to the wikihop task" in capsys.readouterr().err


def test_a_package_under_tasks_is_registered_by_its_decorated_function(clean_registry, tmp_path, monkeypatch, files,
                                                                        capsys):
    write_package(tmp_path, "numbers", init=TOY_INIT)
    monkeypatch.setattr(task_registry, "__path__", [*task_registry.__path__, str(tmp_path)])

    @task_registry.REGISTRY.task("numbers")
    def numbers():  # as tasks/__init__.py lists each built-in task
        return importlib.import_module("longdoc.tasks.numbers").TASK

    assert "longdoc.tasks.numbers" not in sys.modules  # listed, not imported until asked for
    assert "numbers" in task_registry.task_names()
    assert cli.main(["evaluate", "numbers", *files, "--tolerance", "1"]) == 0
    assert json.loads(capsys.readouterr().out) == {"within_tolerance": 3 / 4}
    assert importlib.import_module("longdoc.tasks.numbers").TASK is task_registry.get_task("numbers")


def test_a_taken_name_is_refused(clean_registry):
    with pytest.raises(ValueError, match="a task named 'wikihop' is already registered"):
        task_registry.register(toy_task("anything", name="wikihop"))
    task_registry.register(toy_task("anything"))
    with pytest.raises(ValueError, match="a task named 'numbers' is already registered"):
        task_registry.register(toy_task("anything"))
    with pytest.raises(ValueError, match="a task named 'hotpotqa' is already registered"):
        task_registry.REGISTRY.task("hotpotqa")(lambda: toy_task("anything", name="hotpotqa"))


def test_a_record_under_another_name_is_refused(clean_registry):
    task_registry.REGISTRY.task("numbers")(lambda: toy_task("anything", name="figures"))
    with pytest.raises(ValueError, match="the task registered as 'numbers' is named 'figures'"):
        task_registry.get_task("numbers")


def test_listing_the_tasks_imports_none():
    import subprocess

    code = ("import sys; from longdoc import tasks; names = tasks.task_names(); "
            "print(names, [m for m in sys.modules if m.startswith('longdoc.tasks.')])")
    printed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert printed.strip() == "['hotpotqa', 'multihop', 'nq', 'openkp', 'wikihop'] []"

