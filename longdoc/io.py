"""Reading user files with errors that point at the file and line, and writing files atomically.

Every file longdoc writes (predictions, metrics, checkpoints' side files) goes through
`atomic_write_*`: the content lands in a temporary file in the same folder and is renamed over the
target, so a crash never leaves a half-written file behind.
"""

import gzip
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

from longdoc.errors import InputError


def _open_text(path: Path):
    # Files are decoded with replacement so that stray bytes never abort a run; the JSON parser
    # then reports where the text stops being JSON.
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


def read_json(path: str | os.PathLike) -> Any:
    """Parse a whole JSON file; a syntax error names the file, line and column."""
    path = Path(path)
    with _open_text(path) as handle:
        text = handle.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(f"{path}:{error.lineno}:{error.colno}: not valid JSON: {error.msg}") from None


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """Yield (line number, parsed object) for each non-blank line of a JSON-lines file (.gz too)."""
    path = Path(path)
    with _open_text(path) as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield line_number, json.loads(line)
            except json.JSONDecodeError as error:
                raise InputError(f"{path}:{line_number}:{error.colno}: not valid JSON: {error.msg}") from None


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` so that readers see either the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, value: Any, indent: int | None = 2) -> None:
    atomic_write_text(path, json.dumps(value, indent=indent, ensure_ascii=False) + "\n")
