"""Weights saved before the per-softmax submodules (attention.long_relative_key, ...; now
attention.long_softmax.relative_key, ...) are refused by the task models' loads, naming `longdoc
upgrade`, and load to the same model once upgraded (the encoder's own load: tests/model/test_auto_classes.py)."""

import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from longdoc.convert.upgrade import upgrade_model_folder
from longdoc.errors import InputError
from longdoc.model.encoder_folder import record_checksum
from longdoc.model.pretrained import GlobalLocalModel
from tests.model.conftest import make_inputs, tiny_config
from tests.model.test_heads import ToyModel

# The old names, written out here rather than read from the
# rename table under test.
_CURRENT = re.compile(r"attention\.(long|global)_softmax\.(relative_key|relative_bias|talking_heads_pre|talking_heads_post)$")


def rewrite_to_old_names(weights_file) -> None:
    weights = load_file(weights_file)
    old = {_CURRENT.sub(r"attention.\1_\2", name): tensor for name, tensor in weights.items()}
    assert sum(name != renamed for name, renamed in zip(weights, old)) == 24  # 3 layers x 2 softmaxes x 4
    save_file(old, weights_file, metadata={"format": "pt"})


@pytest.fixture()
def trained():
    """A tiny encoder with relative positions and talking heads, every parameter moved off its
    initial value (so a parameter left at initialisation cannot pass)."""
    torch.manual_seed(0)
    model = GlobalLocalModel(tiny_config(num_hidden_layers=3, talking_heads=True, residual_attention=True)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return model


def test_old_names_are_refused_by_every_task_model_load_until_upgraded(trained, tmp_path):
    """An old lifted encoder cannot start a task model (from_encoder), nor an old trained task model
    restore (TaskModel.from_pretrained), until `longdoc upgrade` renamed its weights once; then both
    hold the weights they were saved with."""
    trained.save_pretrained(tmp_path / "encoder")
    rewrite_to_old_names(tmp_path / "encoder" / "model.safetensors")
    with pytest.raises(InputError, match=r"under their old names .*longdoc upgrade"):
        ToyModel.from_encoder(tmp_path / "encoder")
    assert len(upgrade_model_folder(tmp_path / "encoder")) == 1
    started = ToyModel.from_encoder(tmp_path / "encoder")
    for name, value in trained.state_dict().items():
        assert torch.equal(started.encoder.state_dict()[name], value), name

    started.save_pretrained(tmp_path / "toy")
    rewrite_to_old_names(tmp_path / "toy" / "model.safetensors")
    record_checksum(tmp_path / "toy" / "model.safetensors")  # as longdoc's save_model records it
    with pytest.raises(InputError, match=r"under their old names .*longdoc upgrade"):
        ToyModel.from_pretrained(tmp_path / "toy")
    assert upgrade_model_folder(tmp_path / "toy") == {tmp_path / "toy" / "model.safetensors": 24}
    restored = ToyModel.from_pretrained(tmp_path / "toy")  # the checksum follows the rewritten bytes
    for name, value in started.state_dict().items():
        assert torch.equal(restored.state_dict()[name], value), name
