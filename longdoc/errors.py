"""The exception type for bad user input, and its kind for a model folder of the wrong kind.

Library code raises `InputError` (a `ValueError`) with a message that names the file, line, field
or argument at fault; the command line prints that message and exits with status 2 instead of a
traceback.
"""

from pathlib import Path


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
