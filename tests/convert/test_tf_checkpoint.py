"""longdoc.convert.tf_checkpoint against checkpoints written by TensorFlow's own saver
(tests/fixtures/tf_checkpoint/make_fixtures.py; TensorFlow is not imported here)."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from longdoc.convert.tf_checkpoint import TFCheckpoint, find_checkpoint
from longdoc.errors import InputError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tf_checkpoint"


def expected(folder: Path) -> tuple[dict[str, np.ndarray], dict]:
    with np.load(folder / "expected.npz") as arrays:
        numeric = {key.replace("|", "/"): arrays[key] for key in arrays.files}
    strings = json.loads((folder / "expected_strings.json").read_text())
    return numeric, strings


@pytest.mark.parametrize("name, shards", [("single", 1), ("sharded", 2)])
def test_reads_every_tensor_as_tensorflow_saved_it(name, shards):
    folder = FIXTURES / name
    checkpoint = TFCheckpoint(find_checkpoint(folder))
    numeric, strings = expected(folder)
    assert checkpoint.num_shards == shards
    assert sorted(checkpoint) == sorted([*numeric, *strings])
    for tensor_name, value in numeric.items():
        read = checkpoint.read(tensor_name)
        assert read.dtype == value.dtype, tensor_name
        assert read.shape == value.shape, tensor_name
        np.testing.assert_array_equal(read, value, err_msg=tensor_name)
    assert checkpoint.read("model/string_scalar") == strings["model/string_scalar"].encode("latin-1")
    assert checkpoint.read("model/string_vector") == [item.encode("latin-1") for item in strings["model/string_vector"]]


def test_reads_an_object_based_checkpoint():
    checkpoint = TFCheckpoint(find_checkpoint(FIXTURES / "object_based"))
    with np.load(FIXTURES / "object_based" / "expected.npz") as arrays:
        numeric = {key.replace("|", "/"): arrays[key] for key in arrays.files}
    assert sorted(checkpoint) == sorted([*numeric, "_CHECKPOINTABLE_OBJECT_GRAPH"])
    for name, value in numeric.items():
        read = checkpoint.read(name)
        assert read.dtype == value.dtype and read.shape == value.shape, name
        np.testing.assert_array_equal(read, value, err_msg=name)
    # The object graph is a serialized proto in a string scalar; its checksum was verified on reading.
    assert b"dense" in checkpoint.read("_CHECKPOINTABLE_OBJECT_GRAPH")


def test_sharded_checkpoint_uses_both_shards():
    checkpoint = TFCheckpoint(find_checkpoint(FIXTURES / "sharded"))
    assert {entry.shard for entry in checkpoint.entries.values()} == {0, 1}


def test_checkpoint_file_names_the_prefix(tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(FIXTURES / "single", folder)
    assert find_checkpoint(folder) == folder / "model.ckpt-7"
    # Without the state file, the only index is taken; with two and no state file, none is guessed.
    (folder / "checkpoint").unlink()
    assert find_checkpoint(folder) == folder / "model.ckpt-7"
    shutil.copy(folder / "model.ckpt-7.index", folder / "model.ckpt-8.index")
    with pytest.raises(InputError, match=r"several checkpoints \(model.ckpt-7.index, model.ckpt-8.index\)"):
        find_checkpoint(folder)


def test_a_prefix_names_its_checkpoint():
    assert find_checkpoint(FIXTURES / "sharded" / "model.ckpt-7") == FIXTURES / "sharded" / "model.ckpt-7"


def test_folder_without_checkpoint(tmp_path):
    (tmp_path / "etc_config.json").write_text("{}")
    with pytest.raises(InputError, match=rf"{tmp_path}: no TF checkpoint here \(expected a file PREFIX.index"):
        find_checkpoint(tmp_path)
    with pytest.raises(InputError, match="not a folder"):
        find_checkpoint(tmp_path / "etc_config.json")


def copy_single(tmp_path) -> Path:
    folder = tmp_path / "ckpt"
    shutil.copytree(FIXTURES / "single", folder)
    return folder


def test_truncated_data_shard_is_named(tmp_path):
    folder = copy_single(tmp_path)
    shard = folder / "model.ckpt-7.data-00000-of-00001"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(InputError, match=rf"{shard}: \d+ bytes, but .* needs bytes .*\(the shard is truncated\)"):
        TFCheckpoint(folder / "model.ckpt-7")


def test_missing_data_shard_is_named(tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(FIXTURES / "sharded", folder)
    (folder / "model.ckpt-7.data-00001-of-00002").unlink()
    with pytest.raises(InputError, match=r"data-00001-of-00002: missing \(the index model.ckpt-7.index lists 2 data shard"):
        TFCheckpoint(folder / "model.ckpt-7")


def test_damaged_tensor_bytes_fail_the_checksum(tmp_path):
    folder = copy_single(tmp_path)
    checkpoint = TFCheckpoint(folder / "model.ckpt-7")
    entry = checkpoint.entries["model/dense/kernel"]
    shard = folder / "model.ckpt-7.data-00000-of-00001"
    data = bytearray(shard.read_bytes())
    data[entry.offset + 5] ^= 0x10
    shard.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"checksum mismatch for model/dense/kernel .*the shard is damaged"):
        checkpoint.read("model/dense/kernel")
    # Other tensors still read.
    assert checkpoint.read("global_step") == 7


@pytest.mark.parametrize("damage, message", [
    (lambda data: b"not an index at all, just some text that is long enough for a footer.", "not a TF checkpoint index"),
    (lambda data: data[:30], "too short for a TF checkpoint index"),
    (lambda data: data[:100] + data[-48:], "runs past the table's end"),
    (lambda data: data[:40] + bytes([data[40] ^ 1]) + data[41:], r"checksum mismatch in the block at byte 0 \(the index is damaged\)"),
])
def test_index_that_does_not_parse_is_named(tmp_path, damage, message):
    folder = copy_single(tmp_path)
    index = folder / "model.ckpt-7.index"
    index.write_bytes(damage(index.read_bytes()))
    with pytest.raises(InputError, match=rf"{index}: .*{message}"):
        TFCheckpoint(folder / "model.ckpt-7")
