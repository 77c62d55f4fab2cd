"""A longdoc model folder, read and written in one place for every command.

A model folder holds `config.json` (a `GlobalLocalConfig`, model_type "longdoc-global-local"; a
trained task model's also names its `task` and `task_options`), `model.safetensors`, the tokenizer's
files, and, where a command made it from another checkpoint (`longdoc lift`, `longdoc convert`), a
model card `README.md` saying from what and how; a pretrained encoder adds its pretraining heads.

Reading: `read_model_folder(DIR)` reads config.json once into a `ModelFolder` (path, config, task),
which a command makes once and hands to what loads from the folder; `read_tokenizer(DIR)` (the folder's own tokenizer class, from local files only) and
`load_model(DIR, model_class)` (the weights through the class's checks: a folder of another kind
is a ModelFolderError, a damaged weights file an InputError naming it; longdoc.model.encoder_folder
holds those checks, which the model classes run themselves).

Writing: `save_model(folder, model, tokenizer, ...)` writes the files; where they go decides how a
folder changes, never half-written:
- `write_new_folder(out, write)`: a folder that must not exist yet (lift, convert): built beside it,
  then renamed into place;
- `replace_folder(target, write)`: a folder that may exist and is replaced whole (the demo's published
  model, a pretrained encoder);
- `write_into(folder, write)`: a model added to a folder that holds other things (a training run's
  output, with its checkpoints and logs): each file written beside, then renamed over its name.
`copy_model(source, target)` copies a folder's model files (not its checkpoints, predictions or
logs) with `replace_folder`.
"""

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from longdoc.errors import InputError, OptionError

MODEL_CARD = "README.md"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json")
# A model card line containing this (any case) says the model learnt from generated text, not real documents.
GENERATED_DATA_MARK = "trained on generated"


@dataclass(frozen=True)
class ModelFolder:
    """A longdoc model folder as read once: where it is, its config.json as read, and the task that
    config names (None for a bare encoder)."""

    path: Path
    config: Mapping[str, Any]
    task: str | None

    def model_config(self):
        """The config as the model classes take it (a GlobalLocalConfig, `task` and `task_options` included)."""
        from longdoc.model.config import GlobalLocalConfig

        return GlobalLocalConfig.from_dict(dict(self.config))

    def generated_data_note(self) -> str | None:
        """The line of the folder's model card that says the model was trained on generated data
        (GENERATED_DATA_MARK, any case); None when the card says no such thing or there is no card."""
        card = self.path / MODEL_CARD
        if not card.is_file():
            return None
        lines = card.read_text(encoding="utf-8", errors="replace").splitlines()
        return next((line.strip() for line in lines if GENERATED_DATA_MARK in line.lower()), None)


def read_model_folder(directory: str | Path, wanted: str = "") -> ModelFolder:
    """The folder's config.json, read once and checked: InputError naming the folder when it is not a
    folder or has no readable config, ModelFolderError when it is not a longdoc model (`wanted`: the
    task wanted, as longdoc.model.encoder_folder.describe_checkpoint takes it)."""
    from longdoc.model.encoder_folder import describe_checkpoint

    config = describe_checkpoint(directory, wanted)
    return ModelFolder(Path(directory), config, config.get("task") or None)


def read_tokenizer(directory: str | Path):
    """The folder's own tokenizer (a transformers tokenizer), loaded from local files only.

    The class tokenizer_config.json names is loaded directly: AutoTokenizer would also read
    config.json to guess it, and warn that transformers does not know a longdoc folder's model_type
    (`longdoc-global-local`). A BERT folder without that name is left to AutoTokenizer (its config's
    model_type says which tokenizer)."""
    import json

    from transformers import AutoTokenizer
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    directory = Path(directory)
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise InputError(f"{directory}: no tokenizer files (expected one of {', '.join(TOKENIZER_FILES)})")
    tokenizer_class = AutoTokenizer
    config_path = directory / "tokenizer_config.json"
    if config_path.is_file():
        try:
            class_name = json.loads(config_path.read_text(encoding="utf-8")).get("tokenizer_class")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as error:
            raise InputError(f"{config_path}: not a JSON object ({error})") from None
        if class_name:
            tokenizer_class = tokenizer_class_from_name(class_name)
            if tokenizer_class is None:
                raise InputError(f"{config_path}: tokenizer_class {class_name!r} is not a transformers tokenizer")
    try:
        return tokenizer_class.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError) as error:
        raise InputError(f"{directory}: the tokenizer could not be loaded: {error}") from None


def load_model(directory: str | Path, model_class, config=None) -> tuple:
    """(the model of `model_class` in `directory`, in eval mode, its tokenizer). `config`: the folder's
    config as already read (ModelFolder.model_config()); None: read from the folder."""
    return model_class.from_pretrained(directory, config=config).eval(), read_tokenizer(directory)


def save_model(folder: str | Path, model, tokenizer=None, *, state_dict: Mapping | None = None, card: str | None = None,
               extra_weights: Mapping[str, Mapping] | None = None) -> None:
    """Write `model`, its tokenizer, the model card and extra weights files into `folder`.

    Each weights file gets its sha256 beside it, checked when it is read
    (longdoc.model.encoder_folder.check_weights); a model saved in shards has no one weights file
    to sum.

    Args:
        folder: the model folder written into.
        model: a transformers model, written as config.json and model.safetensors
            (`save_pretrained`).
        tokenizer: written beside it (`save_pretrained`); None: no tokenizer files.
        state_dict: weights written instead of the model's own, e.g. gathered from shards; None:
            the model's.
        card: the model card's text (MODEL_CARD); None: no card.
        extra_weights: more weights files, {file name: tensors by name}, each written as
            safetensors; None: none.
    """
    from safetensors.torch import save_file

    from longdoc.model.encoder_folder import WEIGHTS_FILE, record_checksum

    folder = Path(folder)
    model.save_pretrained(folder, state_dict=None if state_dict is None else dict(state_dict),
                          safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    if card is not None:
        (folder / MODEL_CARD).write_text(card, encoding="utf-8")
    for name, tensors in (extra_weights or {}).items():
        save_file({key: value.contiguous() for key, value in tensors.items()}, str(folder / name))
    for name in (WEIGHTS_FILE, *(extra_weights or {})):
        if (folder / name).is_file():  # (a model saved in shards has no one weights file)
            record_checksum(folder / name)


def is_model_file(path: Path) -> bool:
    """Whether a file of a folder is part of its model (weights, config, tokenizer, card)."""
    from longdoc.model.encoder_folder import CHECKSUM_SUFFIX

    return path.is_file() and (path.name.endswith((".safetensors", ".safetensors" + CHECKSUM_SUFFIX))
                               or path.name in ("config.json", MODEL_CARD)
                               or path.name.startswith(("tokenizer", "special_tokens", "vocab")))


def write_new_folder(out: Path, write: Callable[[Path], None]) -> Path:
    """Run `write(folder)` on a fresh temporary folder beside `out`, then rename it to `out` (which
    must not exist, or be an empty folder). On any error nothing is left behind."""
    refuse_existing(out)
    building = _building_beside(out)
    try:
        write(building)
        _readable_by_all(building)
        refuse_existing(out)
        if out.is_dir():
            out.rmdir()  # empty: checked just above
        os.rename(building, out)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return out


def refuse_existing(out: Path) -> None:
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise OptionError("{out} {path}: already exists and is not an empty folder; choose another or remove it",
                          path=out)


def replace_folder(target: Path, write: Callable[[Path], None]) -> Path:
    """Run `write(folder)` on a fresh folder beside `target`, then put it in `target`'s place; what was
    there is removed only once the new folder is whole."""
    target = Path(target)
    building = _building_beside(target)
    previous = target.with_name(f".{target.name}.previous")
    try:
        write(building)
        _readable_by_all(building)
        shutil.rmtree(previous, ignore_errors=True)
        if target.exists():
            target.rename(previous)
        os.rename(building, target)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    shutil.rmtree(previous, ignore_errors=True)
    return target


def write_into(folder: Path, write: Callable[[Path], None]) -> None:
    """Run `write(staging)` on a staging folder inside `folder`, then move each file it wrote over its
    name in `folder`, flushed to disk first: each file appears whole (others in `folder` stay)."""
    folder = Path(folder)
    staging = folder / f".staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        write(staging)
        for path in sorted(staging.rglob("*")):
            if path.is_file():
                target = folder / path.relative_to(staging)
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(path, "rb") as handle:
                    os.fsync(handle.fileno())
                os.replace(path, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def copy_model(source: Path, target: Path) -> Path:
    """The model files of `source` (`is_model_file`) copied to `target`, which is replaced whole."""

    def copy(folder: Path) -> None:
        for path in Path(source).iterdir():
            if is_model_file(path):
                shutil.copy2(path, folder / path.name)

    return replace_folder(target, copy)


def _building_beside(out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))


def _readable_by_all(folder: Path) -> None:
    """Give the folder and its files the permissions the user's umask asks for: mkdtemp makes the
    folder private and the weights writer makes its file private, but a model folder is meant to be shared."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(folder, 0o777 & ~umask)
    for path in folder.iterdir():
        os.chmod(path, 0o666 & ~umask)
