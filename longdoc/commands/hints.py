"""The library's messages as the command line says them: options as flags, and what to run instead
of a model folder of the wrong kind.

The library names options by their fields (`longdoc.errors.OptionError`, `OptionWarning`) and says
what a folder holds and what was wanted (`longdoc.errors.ModelFolderError`); only the command line
knows its own commands and flags, so the flags and the hints are written here.
"""

from pathlib import Path

from longdoc.errors import InputError, ModelFolderError, OptionError, OptionWarning
from longdoc.data.options import flag_of

READER_HINT = ("--model takes a reader folder: an extractive QA checkpoint lifted with `longdoc lift --from "
               "QA_CHECKPOINT --out DIR`, or a model trained with `longdoc train hotpotqa|multihop`; without --model, "
               "answers are the sentences nearest the question")


def require_reader_folder(path: Path) -> None:
    """`ask --model` and `serve --model`: a folder, told before the documents are indexed."""
    if path.is_file():
        raise InputError(f"{path}: a file, not a model folder; {READER_HINT}")
    if not path.is_dir():
        raise InputError(f"{path}: no such folder; {READER_HINT}")


def as_flags(message: OptionError | OptionWarning) -> str:
    """The message with each option named by its flag (batch_size -> --batch-size)."""
    return message.message(flag_of)


def with_hint(error: InputError) -> str:
    """The error's message (options named by their flags), followed, for a model folder of the wrong
    kind, by the commands that make or use the right one."""
    if isinstance(error, OptionError):
        return as_flags(error)
    if not isinstance(error, ModelFolderError):
        return str(error)
    holds, wanted = error.holds, error.wanted
    train = f"train one with `longdoc train {wanted} --init ENCODER_DIR --out DIR`"
    if wanted == ModelFolderError.READER:
        train = ("--model takes a reader: an extractive QA checkpoint lifted with `longdoc lift --from QA_CHECKPOINT "
                 "--out DIR`, or a model trained with `longdoc train hotpotqa|multihop`")
    if holds is None:
        hint = "turn a BERT-family checkpoint into a longdoc encoder with `longdoc lift --from DIR --out DIR`"
    elif not wanted:
        hint = ("--init takes a lifted encoder (`longdoc lift`, or leave --init out for the default lifted "
                f"MiniLM); to use this model: `longdoc predict {holds} --model {error.directory}`")
    elif not holds:
        hint = train
    else:
        hint = f"use it with `longdoc predict {holds}`, or {train}"
    return f"{error}; {hint}"
