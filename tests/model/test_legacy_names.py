"""Weights saved before the per-softmax submodules (attention.long_relative_key, ...; now
attention.long_softmax.relative_key, ...) load through every load path to the same model."""

import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from longdoc.model.modeling import GlobalLocalModel
from tests.model.conftest import make_inputs, tiny_config
from tests.model.test_heads import ToyModel

# The names as models were saved up to November 2026, written out here rather than read from the
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


def outputs(model, inputs):
    with torch.no_grad():
        output = model.eval()(**inputs)
    return output.long_hidden_state, output.global_hidden_state


def test_old_names_load_through_from_pretrained_and_save_as_new(trained, tmp_path):
    trained.save_pretrained(tmp_path / "old")
    rewrite_to_old_names(tmp_path / "old" / "model.safetensors")
    assert "encoder.layers.2.attention.global_talking_heads_post" in load_file(tmp_path / "old" / "model.safetensors")

    loaded, info = GlobalLocalModel.from_pretrained(tmp_path / "old", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    inputs = make_inputs(2, 19, 5, padding=True, structure=True)
    for ours, theirs in zip(outputs(loaded, inputs), outputs(trained, inputs)):
        assert torch.equal(ours, theirs)

    # Saved again, it is saved under the current names (not those it was loaded from).
    loaded.save_pretrained(tmp_path / "again")
    names = set(load_file(tmp_path / "again" / "model.safetensors"))
    assert names == set(trained.state_dict())


def test_old_names_load_through_load_state_dict(trained):
    old = {_CURRENT.sub(r"attention.\1_\2", name): tensor for name, tensor in trained.state_dict().items()}
    assert "encoder.layers.0.attention.long_relative_bias" in old
    torch.manual_seed(1)
    fresh = GlobalLocalModel(trained.config)
    fresh.load_state_dict(old, strict=True)
    inputs = make_inputs(2, 13, 4, padding=True, structure=True)
    for ours, theirs in zip(outputs(fresh, inputs), outputs(trained, inputs)):
        assert torch.equal(ours, theirs)


def test_old_names_load_into_task_models(trained, tmp_path):
    """An old lifted encoder starts a task model (from_encoder), and an old trained task model restores
    (TaskModel.from_pretrained)."""
    trained.save_pretrained(tmp_path / "encoder")
    rewrite_to_old_names(tmp_path / "encoder" / "model.safetensors")
    started = ToyModel.from_encoder(tmp_path / "encoder")
    for name, value in trained.state_dict().items():
        assert torch.equal(started.encoder.state_dict()[name], value), name

    started.save_pretrained(tmp_path / "toy")
    rewrite_to_old_names(tmp_path / "toy" / "model.safetensors")
    restored = ToyModel.from_pretrained(tmp_path / "toy")
    for name, value in started.state_dict().items():
        assert torch.equal(restored.state_dict()[name], value), name
    batch = make_inputs(1, 11, 3, padding=False, structure=True)
    with torch.no_grad():
        # Close, not equal: MKL's float32 GEMM rounds differently for the same weights at another
        # address (seen on an AMD EPYC for the head's weights, read from safetensors 20 bytes off a
        # 64-byte boundary); the weights themselves are equal above.
        torch.testing.assert_close(restored.eval()(**batch), started.eval()(**batch), rtol=1e-6, atol=1e-7)
