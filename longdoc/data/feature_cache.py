"""Training rows built once: a training run's features, cached on disk and reused by the next run that
would build the same ones.

`cached_rows(build, key, where)` returns `build()`'s rows (a list of dicts of Python ints, floats,
bools and lists of them: every task's `training_features`), stored under `where/KEY/`, or the rows
stored there by an earlier run with the same key. The key (`FeatureKey`) hashes everything the rows
depend on: the training data's bytes (a file, or every file of a `datasets` folder), the
tokenizer (its full serialised form: vocabulary, normaliser, pre-tokeniser, special tokens), the
model config the features read (lengths, input conventions, the task options the model keeps, with
only the encoder switches that change no input left out), the task's options record, the task's
name, and the source of the code that builds rows (the task's package and longdoc/data): a changed
file, setting or feature code builds the rows again.

An entry is a `datasets` Arrow folder (memory-mapped when read: a run reads its rows from disk
instead of holding every window's lists in memory) and a manifest with the row count and the
SHA-256 of each Arrow file. It is written beside its place and renamed into it, so an entry is
whole or absent; two processes building the same key (under torchrun) keep the first. An entry that
does not match its manifest, or cannot be read, is built again, with a warning. The `KEEP` entries
used last stay; older ones are removed when a new one is stored. The warnings the build gave (a bad
line skipped, windows cut) are kept in the manifest and given again by every run that reads the
entry: rows read from the cache say what rows built from the file would have said.
"""

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from longdoc.io import hash_file

MANIFEST = "manifest.json"
KEEP = 8  # entries kept (the most recently used)
_ABANDONED_SECONDS = 24 * 3600  # a half-written entry this old belongs to a process that was killed
# The layout of an entry; a change gives every key another folder.
FORMAT_VERSION = 2
# Config fields the feature code never reads that a run may change (encoder switches at --init and
# transformers' bookkeeping): left out of the key, so switching them reuses the rows.
_CONFIG_FIELDS_NOT_READ = ("residual_attention", "talking_heads", "residual_attention_running_mean",
                           "transformers_version", "architectures", "_name_or_path", "dtype", "torch_dtype")


@dataclass(frozen=True)
class FeatureKey:
    """What training rows depend on, as hashable JSON values."""

    task: str
    data: str  # content digest of the training data
    tokenizer: str  # digest of the tokenizer's serialised form
    config: dict
    options: dict
    code: str  # digest of the feature code's sources

    def digest(self) -> str:
        text = json.dumps({"format": FORMAT_VERSION, **self.__dict__}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def file_digest(paths: Iterable[Path], root: Path | None = None) -> str:
    """SHA-256 over the files' names (relative to `root`, else the bare names) and bytes, in name order."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(str(path.relative_to(root) if root else path.name).encode("utf-8") + b"\0")
        hash_file(digest, path)
    return digest.hexdigest()


def data_digest(path: str | os.PathLike) -> str:
    """The digest of a data file, or of every file in a data folder (a datasets save_to_disk)."""
    path = Path(path)
    if path.is_dir():
        return file_digest((p for p in path.rglob("*") if p.is_file()), path)
    return file_digest([path])


def tokenizer_digest(tokenizer) -> str:
    """The digest of everything that decides a tokenizer's ids: a fast tokenizer's serialised form
    (vocabulary, normaliser, pre-tokeniser, post-processor, added tokens), else its vocabulary, with
    its class and special tokens either way."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    form = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    described = json.dumps({"class": type(tokenizer).__name__, "special": tokenizer.special_tokens_map,
                            "form": form}, sort_keys=True, default=str)
    return hashlib.sha256(described.encode("utf-8")).hexdigest()


def config_values(config) -> dict:
    """The model config's values that feature code may read (see _CONFIG_FIELDS_NOT_READ)."""
    return {name: value for name, value in sorted(config.to_dict().items()) if name not in _CONFIG_FIELDS_NOT_READ}


def source_digest(paths: Sequence[Path]) -> str:
    """The digest of Python sources: each file of `paths`, and the .py files in each folder of them
    (recursively; named relative to the folder, so the digest is the same wherever the package is
    installed)."""
    digests = [file_digest(Path(path).rglob("*.py"), Path(path)) if Path(path).is_dir() else file_digest([Path(path)])
               for path in paths]
    return hashlib.sha256("".join(digests).encode("ascii")).hexdigest()


def say_on_stderr(text: str) -> None:
    print(text, file=sys.stderr)


def cached_rows(build: Callable[[], list[dict[str, Any]]], key: FeatureKey, where: Path, describe: str = "",
                say: Callable[[str], None] | None = say_on_stderr):
    """The rows of `key`: read from `where/DIGEST/` when an earlier run stored them, else `build()`
    and stored there. `say` tells which (one line, with `describe`, e.g. the data file); None: nothing
    is said (a command run with --quiet)."""
    say = say or (lambda text: None)
    folder = Path(where) / key.digest()
    if folder.is_dir():
        read = _read(folder)
        if read is not None:
            rows, given = read
            os.utime(folder)  # used now: kept longest
            for message in given:
                warnings.warn(message, stacklevel=2)
            say(f"{describe}: {len(rows)} training rows from the feature cache ({folder})")
            return rows
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = build()
    for warning in caught:
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    _write(rows, key, folder, [str(warning.message) for warning in caught])
    _prune(Path(where))
    say(f"{describe}: {len(rows)} training rows built in {time.perf_counter() - started:.1f} s, cached in {folder}")
    return rows


def _read(folder: Path):
    """(the stored rows, a datasets.Dataset; the warnings their build gave), or None after a warning
    when the entry is damaged."""
    from datasets import load_from_disk

    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        for name, expected in manifest["files"].items():
            if file_digest([folder / name]) != expected:
                raise ValueError(f"{name} does not match the manifest")
        rows = load_from_disk(str(folder / "rows"))
        if len(rows) != manifest["rows"]:
            raise ValueError(f"{len(rows)} rows, the manifest says {manifest['rows']}")
        given = manifest["warnings"]
        if not (isinstance(given, list) and all(isinstance(message, str) for message in given)):
            raise ValueError("its warnings are not a list of texts")
    except (OSError, ValueError, KeyError, TypeError) as error:
        warnings.warn(f"{folder}: a damaged feature cache entry ({error}); building the rows again", stacklevel=3)
        shutil.rmtree(folder, ignore_errors=True)
        return None
    return rows, given


def _write(rows: list[dict[str, Any]], key: FeatureKey, folder: Path, given: list[str]) -> None:
    """Store `rows`, and the warnings their build `given`, in `folder`, atomically; a folder another
    process stored first is kept."""
    import datasets

    folder.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp"))
    shown = not datasets.are_progress_bars_disabled()
    try:
        datasets.disable_progress_bars()  # (a second or two: the command says what it cached instead)
        datasets.Dataset.from_list(rows).save_to_disk(str(building / "rows"))
        files = {str(path.relative_to(building)): file_digest([path])
                 for path in sorted((building / "rows").rglob("*")) if path.is_file()}
        manifest = {"rows": len(rows), "files": files, "warnings": given, "key": key.__dict__}
        (building / MANIFEST).write_text(json.dumps(manifest, indent=1, default=str), encoding="utf-8")
        try:
            os.rename(building, folder)
        except OSError:
            if not folder.is_dir():  # not a process that stored the same rows first: a real failure
                raise
    finally:
        if shown:
            datasets.enable_progress_bars()
        shutil.rmtree(building, ignore_errors=True)


def _prune(where: Path) -> None:
    """Remove the entries beyond the KEEP used last, and half-written ones left by killed processes."""
    entries = sorted((path for path in where.iterdir() if path.is_dir() and not path.name.startswith(".")),
                     key=lambda path: path.stat().st_mtime, reverse=True)
    abandoned = [path for path in where.glob(".*.tmp") if time.time() - path.stat().st_mtime > _ABANDONED_SECONDS]
    for path in entries[KEEP:] + abandoned:
        shutil.rmtree(path, ignore_errors=True)
