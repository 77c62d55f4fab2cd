"""The one option type, and options as typed records.

An `Option` is a setting a command offers as `--NAME` and a config file holds as `NAME`. Options are
declared as the fields of frozen dataclasses, the records that travel from the command line to the
training engine and the tasks (`longdoc.train.options.TrainingOptions`, a task's `Task.options`):
`option(default, help)` declares a field with its help text, and `options_of(Record)` lists a
record's fields as `Option`s, from which the command line builds its flags and the config-file
reader checks its keys. A task's metric options (the keywords of its `evaluate_files`) are `Option`s.

A field with `stored=False` is an option of a run (how a training file is read), not of the model:
a task model keeps the others in its config.json (`stored_defaults`).

This module imports no torch: `longdoc --help` builds its parsers from it.
"""

import dataclasses
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Option:
    """One option: `--NAME` on the command line (dashes for underscores), `NAME` in a config file."""

    name: str  # the field or keyword it is passed as, e.g. long_non_null_threshold
    type: Any  # int, float, str, Path, or bool (a --flag/--no-flag switch)
    default: Any
    help: str
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return flag_of(self.name)


def flag_of(name: str) -> str:
    """The command-line flag of an option or field name: batch_size -> --batch-size."""
    return "--" + name.replace("_", "-")


def option(default: Any, help: str, metavar: str | None = None, *, stored: bool = True) -> Any:
    """A dataclass field declaring an option: its default, help text and metavar; `stored=False` for
    an option of a run that a model does not keep."""
    return dataclasses.field(default=default, metadata={"help": help, "metavar": metavar, "stored": stored})


def _base_type(annotation: Any) -> Any:
    """int for `int | None`, Path for `Path | None`; the annotation itself otherwise."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        members = [member for member in typing.get_args(annotation) if member is not type(None)]
        if len(members) == 1:
            return members[0]
    return annotation


def _option_fields(record: Any) -> list[dataclasses.Field]:
    return [field for field in dataclasses.fields(record) if "help" in field.metadata]


def options_of(record: type) -> tuple[Option, ...]:
    """The options a record class declares, in field order."""
    hints = typing.get_type_hints(record)
    return tuple(Option(field.name, _base_type(hints[field.name]), field.default, field.metadata["help"],
                        field.metadata["metavar"]) for field in _option_fields(record))


def stored_defaults(record: type) -> dict[str, Any]:
    """{name: default} of the options a model keeps in its config (those not declared `stored=False`)."""
    return {field.name: field.default for field in _option_fields(record) if field.metadata["stored"]}


def record_values(record: Any) -> dict[str, Any]:
    """The option values of a record by name, in field order."""
    return {field.name: getattr(record, field.name) for field in _option_fields(record)}


def json_values(values: dict[str, Any]) -> dict[str, Any]:
    """Option values as JSON values (paths as text)."""
    return {name: str(value) if isinstance(value, Path) else value for name, value in values.items()}
