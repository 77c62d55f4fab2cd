"""The exception type for bad user input, its kinds for bad option values and for a model folder of
the wrong kind, and the warning about option values.

Library code raises `InputError` (a `ValueError`) with a message that names the file, line, field
or argument at fault; the command line prints that message and exits with status 2 instead of a
traceback. The library names options by their field names (`batch_size`); only the command line
knows its flags, so an `OptionError` (`OptionWarning`) keeps the names apart from the rest of the
message and the command line shows them as its flags (`--batch-size`). A `DeviceMemoryError` is an
OptionError: the batch that did not fit, and the options that make it fit.
"""

import string
from pathlib import Path
from typing import Callable


class InputError(ValueError):
    """Bad input from a user: a file, a field, an argument. The message says which and why."""


class ModelFolderError(InputError):
    """A model folder of another kind than the one wanted: `holds` is None for a folder that is not
    a longdoc model, "" for a bare encoder, else the task of the trained model in it; `wanted` is ""
    for an encoder to start from, READER for a model that `ask` reads with, else the task of the
    trained model wanted."""

    READER = "reader"

    def __init__(self, message: str, directory: str | Path, holds: str | None, wanted: str):
        super().__init__(message)
        self.directory, self.holds, self.wanted = Path(directory), holds, wanted


class _NamesOptions:
    """A message `template` in which `{name}` is an option's name and `{key}` one of `values`;
    `message(name_of)` fills it in, with each option named as `name_of(name)` says."""

    def _keep(self, template: str, values: dict) -> None:
        self.template, self.values = template, values

    def message(self, name_of: Callable[[str], str] = str) -> str:
        names = {field: name_of(field) for _, field, _, _ in string.Formatter().parse(self.template)
                 if field and field not in self.values}
        return self.template.format(**names, **self.values)

    @property
    def options(self) -> list[str]:
        return [field for _, field, _, _ in string.Formatter().parse(self.template) if field and field not in self.values]


class OptionError(_NamesOptions, InputError):
    """Option values that cannot be used, e.g. OptionError("{batch_size} must be >= 1, got {got}", got=0):
    "batch_size must be >= 1, got 0" from the library, "--batch-size must be >= 1, got 0" on the command line."""

    def __init__(self, template: str, **values):
        self._keep(template, values)
        super().__init__(self.message())


class OptionWarning(_NamesOptions, UserWarning):
    """A warning about option values, naming the options as OptionError does."""

    def __init__(self, template: str, **values):
        self._keep(template, values)
        super().__init__(self.message())


class DeviceMemoryError(OptionError):
    """Out of device memory (torch.OutOfMemoryError) on a batch of known shape: the message says what
    ran out (`doing`: "training on", "predicting"), the batch's rows and lengths, and `remedies`, a
    template naming the options that lower the memory a batch takes, e.g. "lower {batch_size}"."""

    def __init__(self, doing: str, rows: int, long_length: int, global_length: int, remedies: str):
        self.rows, self.long_length, self.global_length = rows, long_length, global_length
        super().__init__("out of device memory {doing} a batch of {rows} rows of {long_length} long and "
                         "{global_length} global tokens: " + remedies, doing=doing, rows=rows,
                         long_length=long_length, global_length=global_length)
