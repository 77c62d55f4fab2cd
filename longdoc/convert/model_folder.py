"""Writing a model folder (weights, config, tokenizer, model card) so that it appears whole or not at all."""

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from longdoc.errors import OptionError


def write_model_folder(out: Path, write: Callable[[Path], None]) -> Path:
    """Run `write(folder)` on a fresh temporary folder beside `out`, then rename it to `out`
    (which must not exist, or be an empty folder). On any error nothing is left behind."""
    refuse_existing(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
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


def _readable_by_all(folder: Path) -> None:
    """Give the folder and its files the permissions the user's umask asks for: mkdtemp makes the
    folder private and the weights writer makes its file private, but a model folder is meant to be shared."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(folder, 0o777 & ~umask)
    for path in folder.iterdir():
        os.chmod(path, 0o666 & ~umask)
