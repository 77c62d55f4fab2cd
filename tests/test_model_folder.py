"""longdoc.model_folder: read_tokenizer on a longdoc model folder (the saved tokenizer class, without
transformers' warning about the unknown model_type of config.json), loading through the model
class's checks, and the three ways a folder is written whole or not at all."""

import logging

import pytest
from transformers.utils import logging as transformers_logging

from longdoc.convert.pretrained import default_model_path, default_tokenizer
from longdoc.errors import InputError, ModelFolderError, OptionError
from longdoc.model_folder import (
    copy_model, load_model, read_tokenizer, replace_folder, save_model, write_into, write_new_folder,
)


def test_a_longdoc_folder_loads_its_tokenizer_class_without_a_model_type_warning(tmp_path, caplog):
    # transformers logs through its own logger, which does not propagate by default.
    transformers_logging.enable_propagation()
    try:
        with caplog.at_level(logging.WARNING):
            tokenizer = read_tokenizer(default_model_path())
    finally:
        transformers_logging.disable_propagation()
    assert type(tokenizer) is type(default_tokenizer())
    assert tokenizer("Hello world")["input_ids"] == default_tokenizer()("Hello world")["input_ids"]
    assert not [record for record in caplog.records if "model of type" in record.getMessage()]


def test_an_unknown_tokenizer_class_is_refused(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "NoSuchTokenizer"}')
    with pytest.raises(InputError, match=r"tokenizer_config.json: tokenizer_class 'NoSuchTokenizer'"):
        read_tokenizer(tmp_path)


def _write(names):
    def write(folder):
        for name in names:
            (folder / name).write_text(name)
    return write


def _failing(folder):
    (folder / "config.json").write_text("half")
    raise OSError("disk full")


def test_a_new_folder_appears_whole_or_not_at_all(tmp_path):
    out = tmp_path / "new"
    assert write_new_folder(out, _write(["config.json", "model.safetensors"])) == out
    assert sorted(path.name for path in out.iterdir()) == ["config.json", "model.safetensors"]
    with pytest.raises(OptionError, match="^out .*new: already exists and is not an empty folder"):
        write_new_folder(out, _write(["x"]))
    with pytest.raises(OSError, match="disk full"):
        write_new_folder(tmp_path / "other", _failing)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["new"]  # nothing half-written beside it


def test_a_replaced_folder_stays_as_it_was_until_the_new_one_is_whole(tmp_path):
    target = tmp_path / "model"
    replace_folder(target, _write(["config.json", "old.safetensors"]))
    with pytest.raises(OSError, match="disk full"):
        replace_folder(target, _failing)
    assert sorted(path.name for path in target.iterdir()) == ["config.json", "old.safetensors"]
    replace_folder(target, _write(["config.json", "new.safetensors"]))
    assert sorted(path.name for path in target.iterdir()) == ["config.json", "new.safetensors"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model"]


def test_a_model_written_into_a_run_folder_leaves_its_other_files_and_copying_takes_the_model_only(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "train_log.jsonl").write_text("{}\n")
    write_into(run, _write(["config.json", "model.safetensors", "model.safetensors.sha256", "tokenizer.json",
                            "vocab.txt"]))
    assert sorted(path.name for path in run.iterdir()) == [
        "checkpoints", "config.json", "model.safetensors", "model.safetensors.sha256", "tokenizer.json",
        "train_log.jsonl", "vocab.txt"]
    copy_model(run, tmp_path / "published")
    # The weights' recorded sha256 travels with them: a published copy is checked on load as the run's is.
    assert sorted(path.name for path in (tmp_path / "published").iterdir()) == [
        "config.json", "model.safetensors", "model.safetensors.sha256", "tokenizer.json", "vocab.txt"]


def test_save_and_load_a_task_model_with_its_tokenizer_and_card(tmp_path, tokenizer):
    import torch

    from longdoc.tasks.wikihop.model import WikiHopModel
    from tests.tasks.conftest import TINY_ENCODER, write_encoder

    write_encoder(tmp_path / "encoder", tokenizer, **TINY_ENCODER)
    torch.manual_seed(0)
    model = WikiHopModel.from_encoder(tmp_path / "encoder")
    write_new_folder(tmp_path / "model", lambda folder: save_model(folder, model, tokenizer, card="# a card\n",
                                                                   extra_weights={"extra.safetensors": {
                                                                       "x": torch.zeros(2)}}))
    assert (tmp_path / "model" / "README.md").read_text() == "# a card\n"
    loaded, loaded_tokenizer = load_model(tmp_path / "model", WikiHopModel)
    assert not loaded.training and loaded_tokenizer("a b")["input_ids"] == tokenizer("a b")["input_ids"]
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))
    with pytest.raises(ModelFolderError, match="bare encoder"):
        load_model(tmp_path / "encoder", WikiHopModel)
