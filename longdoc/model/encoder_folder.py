"""A model folder on disk, and a model of an encoder plus heads that starts from one.

A longdoc model folder holds `config.json` (a `GlobalLocalConfig`, `model_type` "global_local";
a trained task model's also names its `task`) and `model.safetensors`. `describe_checkpoint` reads
and checks the config; `readable_weights` turns a damaged safetensors file into an InputError
naming it, checked against the sha256 recorded beside it when longdoc wrote it (`record_checksum`)
and for NaN or infinite values (`check_weights`); a folder of the wrong kind is a `longdoc.errors.ModelFolderError` saying what it holds and what was
wanted (the command line adds how to get the right one: `longdoc.commands.hints`).
`longdoc.model.pretrained.EncoderWithHeads.from_encoder` builds a model of an encoder (`self.encoder`) plus
heads from the weights of a bare encoder folder, with fresh heads. The task models
(`longdoc.model.task_model.TaskModel`) and the pretraining model (`longdoc.model.pretraining`)
both start this way. It lives in longdoc.model.pretrained with the transformers classes it
extends: reading and checking a folder needs torch alone.
"""

import hashlib
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors import SafetensorError

from longdoc.errors import InputError, ModelFolderError
from longdoc.model.config import GlobalLocalConfig


WEIGHTS_FILE = "model.safetensors"
CHECKSUM_SUFFIX = ".sha256"  # model.safetensors.sha256, beside the weights longdoc wrote


@contextmanager
def readable_weights(path: str | Path) -> Iterator[None]:
    """Reading the safetensors weights at `path` (a file, or the folder that holds them) inside this
    block: a damaged file (cut short by a full disk or an interrupted copy, or not safetensors at
    all) is an InputError naming it, instead of safetensors' own error; a file read whole is then
    checked (`check_weights`), since damage that keeps the size leaves a readable header. Every
    reader of weights goes through here: the BERT checkpoint reader (`longdoc.convert.checkpoint`),
    the task models' from_pretrained and from_encoder and the pretraining model's loads."""
    weights = Path(path)
    if weights.is_dir() and (weights / WEIGHTS_FILE).is_file():
        weights = weights / WEIGHTS_FILE
    try:
        yield
        if weights.is_file():  # (a folder of shards has no one file to check)
            check_weights(weights)
    except SafetensorError as error:
        # Only the first line: safetensors' message is one line, a wrapped one from transformers need not be.
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise InputError(f"{weights}: not readable as safetensors ({reason}); the file is damaged or "
                         "incomplete: copy, download or train it again") from None


def checksum_path(weights: Path) -> Path:
    """Where the sha256 of the weights file `weights` is recorded: WEIGHTS.sha256 beside it."""
    return weights.with_name(weights.name + CHECKSUM_SUFFIX)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def record_checksum(weights: Path) -> None:
    """Record the sha256 of a weights file longdoc has just written, beside it, in sha256sum's format
    (so that `sha256sum -c model.safetensors.sha256` checks it too)."""
    checksum_path(weights).write_text(f"{_sha256(weights)}  {weights.name}\n", encoding="utf-8")


def _recorded_sha256(weights: Path) -> str | None:
    path = checksum_path(weights)
    if not path.is_file():
        return None
    fields = path.read_text(encoding="utf-8", errors="replace").split()
    if len(fields) != 2 or len(fields[0]) != 64 or fields[1].lstrip("*") != weights.name:
        raise InputError(f"{path}: not a sha256 line for {weights.name} (expected 'HEX  {weights.name}')")
    return fields[0].lower()


def _first_non_finite(weights: Path) -> str | None:
    """The name of the first tensor of `weights` holding NaN or an infinity; None when all are finite."""
    from safetensors.torch import load_file

    for name, tensor in load_file(weights).items():  # mapped from the file, not copied
        # A tensor's sum is one pass with nothing allocated, and is finite when every value is, but for
        # an overflow of finite values: the exact test, on the rare tensor whose sum is not, rules it out.
        if tensor.is_floating_point() and not torch.isfinite(tensor.sum()) and not torch.isfinite(tensor).all():
            return name
    return None


def check_weights(weights: Path) -> None:
    """InputError naming the safetensors file `weights` when its bytes differ from the sha256 recorded
    beside it (`record_checksum`; a file without one is not checked so), or when one of its tensors
    holds NaN or infinite values (which a model would turn into empty answers): a bad copy or a
    failing disk that kept the file's size, or a training run that diverged."""
    recorded = _recorded_sha256(weights)
    if recorded is not None and _sha256(weights) != recorded:
        raise InputError(f"{weights}: its sha256 differs from the one recorded when it was written "
                         f"({checksum_path(weights).name}): the file was damaged since, by a bad copy or a failing "
                         "disk; copy, download or train it again")
    name = _first_non_finite(weights)
    if name is not None:
        cause = ("the file is as it was written: the training run that saved it diverged" if recorded is not None
                 else "the file is damaged, or the training run that saved it diverged")
        raise InputError(f"{weights}: tensor {name} holds NaN or infinite values; {cause}")


def describe_checkpoint(directory: str | Path, wanted: str = "") -> dict[str, Any]:
    """The config.json of a longdoc checkpoint folder; InputError naming the folder when there is none,
    a ModelFolderError when it is not a longdoc model (`wanted` as in ModelFolderError)."""
    directory = Path(directory)
    config_path = directory / "config.json"
    expected = "expected a longdoc model folder (config.json + model.safetensors)"
    if not directory.is_dir():
        raise InputError(f"{directory}: no such folder; {expected}")
    if not config_path.is_file():
        raise InputError(f"{directory}: no config.json; {expected}")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InputError(f"{config_path}: not valid JSON ({error})") from None
    if not isinstance(config, dict) or config.get("model_type") != GlobalLocalConfig.model_type:
        found = config.get("model_type") if isinstance(config, dict) else None
        raise ModelFolderError(
            f"{directory}: model_type is {found!r}, not {GlobalLocalConfig.model_type!r}: not a longdoc model",
            directory, None, wanted)
    return config
