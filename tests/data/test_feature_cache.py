"""The training-row cache: rows built once and read back equal; a changed file, setting, tokenizer or
feature code builds them again; a damaged entry is built again with a warning; an entry is whole or
absent; the entries used last are kept."""

import copy
import json
import os
import warnings

import pytest

from longdoc.data import feature_cache
from longdoc.data.feature_cache import FeatureKey, cached_rows, data_digest, source_digest, tokenizer_digest

ROWS = [{"long_input_ids": [101, 7, 8, 102], "answer_mask": [False, True, True, False], "label": 1,
         "ngram_labels": [[0.0, 1.0], [0.5, 0.0]], "global_features": None},
        {"long_input_ids": [101, 9, 102], "answer_mask": [False, True, False], "label": -100,
         "ngram_labels": [[1.0], [0.0]], "global_features": None}]


def key(**changes) -> FeatureKey:
    fields = dict(task="longdoc.tasks.toy.features", data="d" * 64, tokenizer="t" * 64,
                  config={"long_max_len": 32, "task_options": {"stride": 8}}, options={"stride": 8}, code="c" * 64)
    return FeatureKey(**{**fields, **changes})


class Builder:
    def __init__(self, rows=ROWS):
        self.rows, self.calls = rows, 0

    def __call__(self):
        self.calls += 1
        return [dict(row) for row in self.rows]


def test_rows_are_built_once_and_read_back_equal(tmp_path):
    build, said = Builder(), []
    first = cached_rows(build, key(), tmp_path, "train.json", said.append)
    second = cached_rows(build, key(), tmp_path, "train.json", said.append)
    assert build.calls == 1 and first == ROWS
    assert len(second) == 2 and [second[i] for i in range(2)] == ROWS  # bools, floats, nesting and None kept
    assert said[0].startswith("train.json: 2 training rows built in ") and "cached in" in said[0]
    assert said[1] == f"train.json: 2 training rows from the feature cache ({tmp_path / key().digest()})"


def test_rows_read_from_the_cache_give_the_warnings_their_build_gave(tmp_path):
    def build():
        warnings.warn("train.json: skipped 1 bad line (line 3)")
        return [dict(row) for row in ROWS]

    for _ in range(2):  # built, then read back
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cached_rows(build, key(), tmp_path, "train.json", None)
        assert [str(warning.message) for warning in caught] == ["train.json: skipped 1 bad line (line 3)"]


@pytest.mark.parametrize("change", [dict(data="e" * 64), dict(tokenizer="u" * 64), dict(code="x" * 64),
                                    dict(options={"stride": 16}), dict(config={"long_max_len": 64})])
def test_anything_the_rows_depend_on_builds_them_again(tmp_path, change):
    build = Builder()
    cached_rows(build, key(), tmp_path, say=lambda text: None)
    cached_rows(build, key(**change), tmp_path, say=lambda text: None)
    assert build.calls == 2 and key(**change).digest() != key().digest()


def test_the_digests_see_the_bytes_the_vocabulary_and_the_code(tmp_path, tokenizer):
    data = tmp_path / "train.json"
    data.write_text("[1]")
    before = data_digest(data)
    data.write_text("[2]")
    assert data_digest(data) != before
    folder = tmp_path / "saved"
    folder.mkdir()
    (folder / "data.arrow").write_text("x")
    assert data_digest(folder) != data_digest(tmp_path / "train.json")
    grown = copy.deepcopy(tokenizer)  # (a copy: the test adds a token to it)
    assert tokenizer_digest(grown) == tokenizer_digest(tokenizer)
    grown.add_tokens(["<new-token>"])
    assert tokenizer_digest(grown) != tokenizer_digest(tokenizer)
    code = tmp_path / "code"
    code.mkdir()
    (code / "features.py").write_text("A = 1\n")
    first = source_digest([code])
    (code / "features.py").write_text("A = 2\n")
    assert source_digest([code]) != first


@pytest.mark.parametrize("damage", ["truncated", "manifest"])
def test_a_damaged_entry_is_built_again_with_a_warning(tmp_path, damage):
    build = Builder()
    cached_rows(build, key(), tmp_path, say=lambda text: None)
    entry = tmp_path / key().digest()
    if damage == "truncated":
        arrow = next((entry / "rows").glob("*.arrow"))
        arrow.write_bytes(arrow.read_bytes()[:100])
    else:
        (entry / "manifest.json").write_text("{")
    with pytest.warns(UserWarning, match=f"{entry}: a damaged feature cache entry .*; building the rows again"):
        rows = cached_rows(build, key(), tmp_path, say=lambda text: None)
    assert build.calls == 2 and rows == ROWS
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # stored whole again
        assert [row for row in cached_rows(build, key(), tmp_path, say=lambda text: None)] == ROWS


def test_a_failed_build_stores_nothing_and_old_entries_go(tmp_path, monkeypatch):
    def failing():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cached_rows(failing, key(), tmp_path, say=lambda text: None)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(feature_cache, "KEEP", 2)
    for stride in (1, 2, 3):
        cached_rows(Builder(), key(options={"stride": stride}), tmp_path, say=lambda text: None)
        os.utime(tmp_path / key(options={"stride": stride}).digest(), (stride, stride))  # used in this order
    kept = sorted(path.name for path in tmp_path.iterdir())
    assert kept == sorted(key(options={"stride": stride}).digest() for stride in (2, 3))
    manifest = json.loads((tmp_path / kept[0] / "manifest.json").read_text())
    assert manifest["rows"] == 2 and manifest["key"]["task"] == "longdoc.tasks.toy.features"
