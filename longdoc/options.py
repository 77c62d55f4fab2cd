"""The one option type: a setting a command offers as `--NAME` and a config file holds as `NAME`.

A task's metric options (keywords of its `evaluate_files`) and training options are `Option`s.

This module imports no torch: `longdoc --help` builds its parsers from it.
"""

from dataclasses import dataclass
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
