"""Atomic writes: the whole file or the old one, the mode a plain open() gives, and a folder
given where a file is needed named in a clear error; decoding: invalid UTF-8 and lone surrogates
replaced one for one, with a warning that counts them."""

import os
import stat

import pytest

from longdoc.errors import InputError
from longdoc.io import atomic_write_json, atomic_write_text, decode_text, read_json, replace_lone_surrogates


def test_atomic_write_replaces_the_file_with_the_umask_mode_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "out" / "metrics.json"
    atomic_write_json(path, {"f1": 0.5})
    atomic_write_json(path, {"f1": 0.75})
    assert read_json(path) == {"f1": 0.75}
    assert os.listdir(path.parent) == ["metrics.json"]
    mask = os.umask(0o022)
    try:
        atomic_write_text(path, "x")
        assert stat.S_IMODE(path.stat().st_mode) == 0o644  # not mkstemp's private 0600
    finally:
        os.umask(mask)


def test_a_folder_where_a_file_is_needed_is_named(tmp_path):
    with pytest.raises(InputError, match=f"{tmp_path} is a folder; a file path is needed here"):
        atomic_write_json(tmp_path, {})


def test_valid_utf8_decodes_silently(recwarn):
    assert decode_text("café".encode(), "x") == "café"
    assert not recwarn.list


def test_invalid_utf8_is_replaced_with_a_counted_warning():
    # b"\xff" and b"\xc3(" hold two invalid sequences: each becomes one U+FFFD; "(" survives.
    with pytest.warns(UserWarning, match=r"doc\.txt: not valid UTF-8; 2 invalid byte sequence"):
        text = decode_text(b"a\xffb \xc3(", "doc.txt")
    assert text == "a\ufffdb \ufffd("


def test_lone_surrogates_are_replaced_one_for_one():
    with pytest.warns(UserWarning, match="1 unpaired surrogate"):
        assert replace_lone_surrogates("a\ud800b", "q") == "a\ufffdb"
