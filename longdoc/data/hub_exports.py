"""Hugging Face `datasets` exports of a dataset, read row by row for the task readers.

Many users hold a dataset as the Hub publishes it rather than as its official file: a folder
written by `Dataset.save_to_disk`, a parquet file (the Hub's own storage), or a JSON-lines export
(`Dataset.to_json`). `hub_rows` yields the rows of any of them as plain Python objects; each task's
reader maps a row of its dataset's Hub schema onto the official record, so both give the same
examples. The reader tells an export from an official file by `export_kind`.

In `datasets`, a sequence of records is stored as one record of lists ({"title": [...], "sent_id":
[...]}), while exports written by other tools keep a list of records; `records` accepts both.
"""

import os
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from longdoc.data.records import RecordFields, json_list_records
from longdoc.errors import InputError
from longdoc.io import iter_jsonl

FORMATS = ("the official file, a folder written by datasets' save_to_disk, a parquet file, "
           "or a JSON-lines export of the Hub's schema")


def export_kind(path: str | os.PathLike) -> str | None:
    """"folder", "parquet" or "jsonl" for a `datasets` export; None for anything else (a JSON list
    starting with "[" is an official file; JSON lines are told apart by their fields, `is_hub_row`)."""
    path = Path(path)
    if path.is_dir():
        return "folder"
    if path.suffix == ".parquet":
        return "parquet"
    return "jsonl" if _first_byte(path) == b"{" else None


def hub_rows(path: str | os.PathLike, dataset: str, columns: Sequence[str]) -> Iterator[tuple[str, int, dict]]:
    """(where, index, row) for each row of the export at `path`, after checking that it has the
    `columns` of `dataset`'s Hub schema (an error names the columns found and those expected)."""
    path = Path(path)
    kind = export_kind(path)
    if kind == "folder":
        table_rows = _folder_rows(path)
    elif kind == "parquet":
        table_rows = _parquet_rows(path)
    else:
        table_rows = ((f"{path}:{number}", row) for number, row in iter_jsonl(path))
    for index, (where, row) in enumerate(table_rows):
        if not isinstance(row, dict):
            raise InputError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
        missing = [name for name in columns if name not in row]
        if missing:
            raise InputError(f"{where}: not a {dataset} export: it has the columns {sorted(row)}, "
                             f"a {dataset} export has {list(columns)} (missing {missing}); read are {FORMATS}")
        yield where, index, row


def example_records(path: str | os.PathLike, dataset: str, id_field: str, columns: Sequence[str],
                    official_record: Callable[[dict, str], dict]) -> Iterator[RecordFields]:
    """The checked fields of each example of a file that is one JSON list of official records, or of
    a `datasets` export whose rows `official_record(row, where)` maps onto official records."""
    if export_kind(path) is None:
        yield from json_list_records(path, dataset, id_field, FORMATS)
        return
    for where, index, row in hub_rows(path, dataset, columns):
        yield RecordFields(official_record(row, where), where, id_field, index)


def records(value: Any, where: str, name: str) -> list[dict]:
    """A sequence of records, given as a list of records or as `datasets` stores it, a record of
    equal-length lists."""
    if isinstance(value, list) and all(isinstance(item, dict) for item in value):
        return value
    if isinstance(value, dict) and all(isinstance(column, list) for column in value.values()):
        lengths = {len(column) for column in value.values()}
        if len(lengths) <= 1:
            count = lengths.pop() if lengths else 0
            return [{key: column[i] for key, column in value.items()} for i in range(count)]
    raise InputError(f"{where}: field {name!r} must be a list of records or a record of equal-length lists")


def _first_byte(path: Path) -> bytes:
    import gzip

    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            while (byte := handle.read(1)) and byte.isspace():
                pass
    except OSError as error:
        raise InputError(f"{path}: cannot be read: {error.strerror or error}") from None
    return byte


def _folder_rows(path: Path) -> Iterator[tuple[str, dict]]:
    if (path / "dataset_dict.json").exists():
        splits = sorted(child.name for child in path.iterdir() if child.is_dir())
        raise InputError(f"{path}: a DatasetDict with the splits {splits}: give one split's folder, e.g. {path / splits[0]}"
                         if splits else f"{path}: a DatasetDict with no split folders")
    if not (path / "dataset_info.json").exists() and not (path / "state.json").exists():
        raise InputError(f"{path}: a folder, but not one written by datasets' save_to_disk (no dataset_info.json "
                         f"or state.json); read are {FORMATS}")
    import datasets

    try:
        table = datasets.load_from_disk(str(path))
    except Exception as error:  # datasets' own reasons (missing arrow files, a newer format)
        raise InputError(f"{path}: datasets could not load this folder: {error}") from None
    for index, row in enumerate(table):
        yield f"{path}: row {index}", row


def _parquet_rows(path: Path) -> Iterator[tuple[str, dict]]:
    import pyarrow
    import pyarrow.parquet

    try:
        parquet = pyarrow.parquet.ParquetFile(path)
    except (pyarrow.ArrowException, OSError) as error:
        raise InputError(f"{path}: not a readable parquet file: {error}") from None
    index = 0
    for batch in parquet.iter_batches(batch_size=256):
        for row in batch.to_pylist():
            yield f"{path}: row {index}", row
            index += 1
