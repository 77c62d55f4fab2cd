"""Reading user files with errors that point at the file and line, and writing files atomically.

Decoding: text that is not valid UTF-8 is decoded with U+FFFD replacement and a warning that counts
the replaced byte runs (unpaired surrogates, which JSON allows, likewise), one character for one, so
character offsets into the decoded string stay exact.

Every file longdoc writes (predictions, metrics, checkpoints' side files) goes through
`atomic_write_*`: the content lands in a temporary file in the same folder and is renamed over the
target, so a crash never leaves a half-written file behind.
"""

import gzip
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator

from longdoc.errors import InputError


def decode_text(data: bytes | str, where: str) -> str:
    """Decode UTF-8 bytes; invalid bytes become U+FFFD with a warning naming `where` and the count."""
    if isinstance(data, str):
        return replace_lone_surrogates(data, where)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("utf-8", errors="replace")
        # Each invalid byte sequence becomes one U+FFFD; genuine U+FFFD in the input are not counted.
        replaced = text.count("\ufffd") - data.count("\ufffd".encode())
        warnings.warn(f"{where}: not valid UTF-8; {replaced} invalid byte sequence(s) replaced by U+FFFD", stacklevel=2)
        return text


def replace_lone_surrogates(text: str, where: str) -> str:
    """Replace unpaired UTF-16 surrogates (JSON allows "\\ud800") by U+FFFD, one for one, so offsets stay exact."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        cleaned = "".join("\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in text)
        count = sum(a != b for a, b in zip(text, cleaned))
        warnings.warn(f"{where}: {count} unpaired surrogate(s) replaced by U+FFFD", stacklevel=2)
        return cleaned


def _read_bytes(path: Path) -> bytes:
    if path.suffix == ".gz":
        with gzip.open(path, "rb") as handle:
            return handle.read()
    return path.read_bytes()


def _parse(text: str, path: Path, line_number: int | None = None):
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        line = error.lineno if line_number is None else line_number
        raise InputError(f"{path}:{line}:{error.colno}: not valid JSON: {error.msg}") from None


def read_json(path: str | os.PathLike) -> Any:
    """Parse a whole JSON file (.gz too). Invalid UTF-8 is replaced with a warning that counts it
    (offsets stay exact in the decoded text); a syntax error names the file, line and column."""
    path = Path(path)
    return _parse(decode_text(_read_bytes(path), str(path)), path)


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """Yield (line number, parsed object) for each non-blank line of a JSON-lines file (.gz too),
    streaming, decoded as in `read_json`."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        for line_number, line in enumerate(handle, start=1):
            if line.strip():
                yield line_number, _parse(decode_text(line, f"{path}:{line_number}"), path, line_number)


def hash_file(digest, path: str | os.PathLike) -> int:
    """Feed the bytes of `path` to `digest` (a hashlib object) a MiB at a time; the number of bytes."""
    size = 0
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    return size


def _umask() -> int:
    mask = os.umask(0)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` so that readers see either the old file or the whole new one."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path} is a folder; a file path is needed here")
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp makes the file private (0600); give it the mode a plain open() would (umask).
        os.fchmod(descriptor, 0o666 & ~_umask())
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
    atomic_write_text(path, json.dumps(value, indent=indent, ensure_ascii=False, allow_nan=False) + "\n")
