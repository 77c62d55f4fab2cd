"""Field checks for dataset records whose errors name the file, the example id and the field.

Task readers use these so that every reader reports a missing or mistyped field the same way
(files are read with longdoc.io; `json_list_records` and `read_json_list` read a file that is one
JSON list of examples).
"""

import os
from typing import Any, Iterator

from longdoc.errors import InputError
from longdoc.io import read_json


class RecordFields:
    """Typed access to one record's fields; errors name `where` (file and line), the example id and field."""

    def __init__(self, record: Any, where: str, id_field: str, index: int):
        self.where = where
        if not isinstance(record, dict):
            raise InputError(f"{where}: example #{index} must be a JSON object, got {type(record).__name__}")
        self.record = record
        example_id = record.get(id_field)
        if not isinstance(example_id, (str, int)) or isinstance(example_id, bool) or example_id == "":
            raise InputError(f"{where}: example #{index}: field {id_field!r} is missing or not a string/integer")
        self.example_id = str(example_id)

    def error(self, name: str, problem: str) -> InputError:
        return InputError(f"{self.where}: example {self.example_id!r}: field {name!r} {problem}")

    def get(self, name: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        """The field `name`, checked to be of `kind`; `default` when it is absent (if given)."""
        if name not in self.record:
            if default is not ...:
                return default
            raise self.error(name, "is missing")
        value = self.record[name]
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
            raise self.error(name, f"must be {_describe(kind)}, got {type(value).__name__}")
        return value

    def string_list(self, name: str, value: Any = ...) -> list[str]:
        """A list of strings (the field `name`, or `value` reported under that name)."""
        value = self.get(name, list) if value is ... else value
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise self.error(name, "must be a list of strings")
        return value


def json_list_records(path: str | os.PathLike, dataset: str, id_field: str, formats: str = "") -> Iterator[RecordFields]:
    """Each example of a file that is one JSON list of examples (HotpotQA, WikiHop), with checked
    fields; `formats`, when given, is added to the error of a file that is not one JSON list."""
    also = f"; read are {formats}" if formats else ""
    try:
        records = read_json(path)
    except InputError as error:
        raise InputError(f"{error}{also}") from None
    if not isinstance(records, list):
        raise InputError(f"{path}: a {dataset} file is a JSON list of examples, got {type(records).__name__}{also}")
    for index, record in enumerate(records):
        yield RecordFields(record, str(path), id_field, index)


def read_json_list(path: str | os.PathLike, dataset: str, id_field: str, required: dict[str, type]) -> list[dict]:
    """The records of a file that is one JSON list of examples (a gold file): at least one, each with
    an id and the `required` fields of their types; errors name the file, the example and the field."""
    records = []
    for fields in json_list_records(path, dataset, id_field):
        for name, kind in required.items():
            fields.get(name, kind)
        records.append(fields.record)
    if not records:
        raise InputError(f"{path}: the {dataset} file holds no examples")
    return records


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _describe(kind: type | tuple[type, ...]) -> str:
    names = {"str": "a string", "list": "a list", "int": "an integer", "dict": "an object", "float": "a number"}
    return " or ".join(names.get(k.__name__, k.__name__) for k in _as_tuple(kind))
