"""Training checkpoints under `--out/checkpoints/step-NNNNNNNNN/`, written atomically, read with fallback.

A checkpoint folder holds
  model.safetensors     every weight (tensors shared by several names stored once, the other names
                        recorded as aliases in the file's metadata);
  training_state.pt     optimizer and scheduler state, and the RNG state of every generator in use
                        (torch, CUDA, Python `random`, numpy) per process; loaded with
                        `torch.load(weights_only=True)`, never unpickled;
  trainer_state.json    the step reached (the position in the data follows from it), the job's
                        identity (task, model class and shape) and the options it ran with.
It is written into a hidden temporary folder beside the others, each file fsynced, and renamed
into place (then the parent folder fsynced): a crash or a full disk mid-write leaves the earlier
checkpoints as they were and no half-written `step-*` folder. `trainer_state.json` is written last,
so a folder without it is not a checkpoint.

Reading takes the newest checkpoint that loads; one that does not (truncated or corrupted file) is
reported with a warning naming the file, and the one before it is used.
"""

import errno
import json
import os
import pickle
import shutil
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from longdoc.io import atomic_write_json

CHECKPOINTS_FOLDER = "checkpoints"
MODEL_FILE = "model.safetensors"
STATE_FILE = "training_state.pt"
TRAINER_STATE_FILE = "trainer_state.json"
_PREFIX = "step-"
_ALIASES_KEY = "longdoc_aliases"


class CheckpointError(RuntimeError):
    """A checkpoint could not be written (out of disk, no permission); the message says what is intact."""


def checkpoints_folder(out_dir: Path) -> Path:
    return Path(out_dir) / CHECKPOINTS_FOLDER


def checkpoint_name(step: int) -> str:
    return f"{_PREFIX}{step:09d}"


def list_checkpoints(out_dir: Path) -> list[Path]:
    """Complete checkpoint folders, oldest first."""
    folder = checkpoints_folder(out_dir)
    if not folder.is_dir():
        return []
    found = [path for path in folder.iterdir()
             if path.is_dir() and path.name.startswith(_PREFIX) and path.name[len(_PREFIX):].isdigit()]
    return sorted(found, key=lambda path: int(path.name[len(_PREFIX):]))


def _fsync_path(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def save_weights(state_dict: dict[str, torch.Tensor], path: Path) -> None:
    """Weights as safetensors; a tensor shared by several names (tied embeddings) is stored once."""
    kept: dict[tuple, str] = {}
    tensors, aliases = {}, {}
    for name, tensor in state_dict.items():
        key = (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
               tensor.dtype) if tensor.numel() else None
        if key is not None and key in kept:
            aliases[name] = kept[key]
            continue
        if key is not None:
            kept[key] = name
        tensors[name] = tensor.detach().to("cpu").contiguous()
    save_file(tensors, str(path), metadata={_ALIASES_KEY: json.dumps(aliases)})


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    """Weights written by `save_weights`, aliases filled in."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        aliases = json.loads((handle.metadata() or {}).get(_ALIASES_KEY, "{}"))
    tensors = load_file(str(path))
    for alias, name in aliases.items():
        tensors[alias] = tensors[name]
    return tensors


def write_checkpoint(
    out_dir: Path, step: int, weights: dict[str, torch.Tensor], training_state: dict[str, Any],
    trainer_state: dict[str, Any], keep_last: int,
) -> Path:
    """Write checkpoint `step` atomically and keep the newest `keep_last`.

    The files go into a hidden temporary folder, each fsynced, which is renamed into place (see the
    module docstring); a checkpoint of the same step already there is replaced whole. On failure the
    earlier checkpoints are untouched.

    Args:
        out_dir: the run's --out; the checkpoint goes under its `checkpoints/` folder.
        step: optimizer steps done; names the folder (`step-NNNNNNNNN`).
        weights: every weight by name, written to model.safetensors (shared tensors stored once).
        training_state: optimizer, scheduler and RNG states, written to training_state.pt.
        trainer_state: the step, the job's identity and its options, written to trainer_state.json.
        keep_last: how many of the newest checkpoints are kept; older ones are deleted.

    Returns:
        The checkpoint's folder.

    Raises:
        CheckpointError: the checkpoint could not be written (out of disk, no permission); the
            message says whether an earlier checkpoint is intact.
    """
    folder = checkpoints_folder(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / checkpoint_name(step)
    temporary = folder / f".tmp-{checkpoint_name(step)}-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    try:
        temporary.mkdir()
        save_weights(weights, temporary / MODEL_FILE)
        torch.save(training_state, temporary / STATE_FILE)
        for name in (MODEL_FILE, STATE_FILE):
            _fsync_path(temporary / name)
        atomic_write_json(temporary / TRAINER_STATE_FILE, trainer_state)
        _fsync_path(temporary)
        if final.exists():  # the same step again (a rerun that only re-evaluates): replace it whole
            stale = folder / f".old-{final.name}-{os.getpid()}"
            os.replace(final, stale)
            shutil.rmtree(stale)
        os.replace(temporary, final)
        _fsync_path(folder)
    except OSError as error:
        shutil.rmtree(temporary, ignore_errors=True)
        previous = [path for path in list_checkpoints(out_dir) if path != final]
        intact = f"the previous checkpoint {previous[-1]} is intact" if previous else "no earlier checkpoint exists"
        reason = "out of disk space" if error.errno == errno.ENOSPC else str(error)
        raise CheckpointError(f"could not write checkpoint {final}: {reason}; {intact}") from error
    for old in list_checkpoints(out_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def read_trainer_state(checkpoint: Path) -> dict[str, Any]:
    with open(checkpoint / TRAINER_STATE_FILE, encoding="utf-8") as handle:
        return json.load(handle)


def load_latest_checkpoint(
    out_dir: Path, load: Callable[[Path], Any],
) -> tuple[Path, Any] | None:
    """`load(folder)` on the newest checkpoint that loads, falling back past broken ones with a
    warning naming the file; None when there is no (loadable) checkpoint."""
    for checkpoint in reversed(list_checkpoints(out_dir)):
        try:
            return checkpoint, load(checkpoint)
        except _UnreadableFile as error:
            warnings.warn(f"checkpoint file {error.path} is unreadable ({error.reason}); falling back to the "
                          "checkpoint before it", stacklevel=2)
    return None


class _UnreadableFile(Exception):
    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


def read_checkpoint_files(checkpoint: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, Any]]:
    """(trainer state, weights, training state) of one checkpoint folder; _UnreadableFile naming the
    file that is missing or corrupt."""
    readers = (
        (TRAINER_STATE_FILE, read_trainer_state),
        (MODEL_FILE, lambda folder: load_weights(folder / MODEL_FILE)),
        (STATE_FILE, lambda folder: torch.load(folder / STATE_FILE, weights_only=True, map_location="cpu")),
    )
    loaded = []
    for name, read in readers:
        try:
            loaded.append(read(checkpoint))
        except (OSError, ValueError, RuntimeError, EOFError, SafetensorError, json.JSONDecodeError,
                pickle.UnpicklingError) as error:
            raise _UnreadableFile(checkpoint / name, f"{type(error).__name__}: {error}".splitlines()[0]) from None
    return tuple(loaded)
