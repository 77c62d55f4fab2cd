"""Every registered task keeps the Task contract (longdoc.data.task): each part it names imports and has
the functions of its protocol, with parameters a caller of the protocol can pass; its model is a
TaskModel of the task's own options; what `longdoc evaluate` passes its metric, it takes."""

import inspect

import pytest

from longdoc.model.task_model import TaskModel
from longdoc.data.task import PART_PROTOCOLS
from longdoc.tasks import REGISTRY


def protocol_functions(protocol: type) -> dict[str, inspect.Signature]:
    """The protocol's functions and their signatures without `self`."""
    functions = {}
    for name, member in vars(protocol).items():
        if callable(member) and not name.startswith("_"):
            signature = inspect.signature(member)
            functions[name] = signature.replace(parameters=list(signature.parameters.values())[1:])
    return functions


def callable_as(function, expected: inspect.Signature) -> list[str]:
    """What keeps `function` from being called as `expected` says: a parameter it lacks or takes
    otherwise (positional where the protocol passes it by keyword, or the reverse), or one it
    requires that the protocol never passes."""
    actual = inspect.signature(function).parameters
    keyword_catch_all = any(p.kind is p.VAR_KEYWORD for p in actual.values())
    problems = []
    positional = [p for p in actual.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for index, parameter in enumerate(expected.parameters.values()):
        if parameter.kind is parameter.VAR_KEYWORD:
            continue  # checked against what the caller passes (the metric options)
        if parameter.kind is parameter.POSITIONAL_OR_KEYWORD:
            if index >= len(positional):
                problems.append(f"no positional parameter {index} ({parameter.name})")
        elif parameter.name not in actual and not keyword_catch_all:
            problems.append(f"no keyword parameter {parameter.name}")
        elif parameter.name in actual and actual[parameter.name].kind is inspect.Parameter.POSITIONAL_ONLY:
            problems.append(f"{parameter.name} is positional only")
        if parameter.default is not inspect.Parameter.empty and parameter.name in actual \
                and actual[parameter.name].default is inspect.Parameter.empty:
            problems.append(f"{parameter.name} is optional in the protocol, required here")
    passed = set(expected.parameters)
    for index, parameter in enumerate(actual.values()):
        required = parameter.default is inspect.Parameter.empty and parameter.kind not in (
            parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
        by_position = parameter.kind is not parameter.KEYWORD_ONLY and index < len(
            [p for p in expected.parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD])
        if required and parameter.name not in passed and not by_position:
            problems.append(f"requires {parameter.name}, which the protocol never passes")
    return problems


TASK_NAMES = REGISTRY.names()


@pytest.mark.parametrize("name", TASK_NAMES)
def test_every_part_follows_its_protocol(name):
    task = REGISTRY.get(name)
    assert task.name == name and task.description and task.headline_metric
    parts = [part for part in PART_PROTOCOLS if getattr(task, part) is not None]
    assert {"reader", "metric"} <= set(parts)
    assert (task.ask is not None) == (name in ("hotpotqa", "multihop"))  # the tasks whose answers are spans
    for part in parts:
        module, protocol = task.load(part), PART_PROTOCOLS[part]
        assert isinstance(module, protocol), f"{name} {part}: {getattr(task, part)} lacks a function of {protocol}"
        for function_name, signature in protocol_functions(protocol).items():
            problems = callable_as(getattr(module, function_name), signature)
            assert not problems, f"{name} {part}.{function_name}: {problems}"


@pytest.mark.parametrize("name", TASK_NAMES)
def test_the_metric_takes_its_options_and_the_model_is_a_task_model_of_its_options(name):
    task = REGISTRY.get(name)
    evaluate_files = inspect.signature(task.load("metric").evaluate_files).parameters
    for option in task.metric_options:
        assert option.name in evaluate_files, f"{name}: evaluate_files takes no {option.name}"
    if task.model is None:
        return
    model_class = task.load("model")
    assert issubclass(model_class, TaskModel) and model_class.task_name
    assert set(model_class.default_task_options) <= {option.name for option in task.train_options}
    assert task.configs is not None and task.configs.is_dir()


def test_the_checker_finds_what_a_caller_could_not_pass():
    def predict(model, data_path, out_path, *, tokenizer, options=None, tune=False, batch_size=8, progress=True):
        """(as the tasks write it)"""

    def predict_missing_progress(model, data_path, out_path, *, tokenizer, options=None, tune=False, batch_size=8):
        """"""

    def predict_extra_required(model, data_path, out_path, *, tokenizer, options, tune, batch_size, progress, seed):
        """"""

    expected = protocol_functions(PART_PROTOCOLS["decode"])["predict"]
    assert callable_as(predict, expected) == []
    assert callable_as(predict_missing_progress, expected) == ["no keyword parameter progress"]
    assert callable_as(predict_extra_required, expected) == [
        "options is optional in the protocol, required here", "tune is optional in the protocol, required here",
        "batch_size is optional in the protocol, required here", "progress is optional in the protocol, required here",
        "requires seed, which the protocol never passes"]
