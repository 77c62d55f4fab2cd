"""The bytes each layer saves for backward on the cpu backend (float32, no dropout) are what
docs/encoder.md's formula ("Training memory: what a layer saves") says: counted with
torch.autograd.graph.saved_tensors_hooks, each storage once, leaving out the parameters (and what
is derived from them alone) and the side inputs every layer shares."""

import collections

import pytest
import torch

from longdoc import GlobalLocalModel
from longdoc.model.kernels import cpu as cpu_kernels
from tests.model.conftest import make_inputs, tiny_config

FLOAT32 = 4


def saved_bytes_per_layer(model: GlobalLocalModel, inputs: dict) -> list[int]:
    """The bytes of the activations each layer of `model` saves for backward, one forward pass."""
    parameters = {parameter.untyped_storage().data_ptr() for parameter in model.parameters()}
    saved: list[dict[int, int]] = [{} for _ in model.encoder.layers]
    current: list[int | None] = [None]

    def pack(tensor):
        storage = tensor.untyped_storage()
        if current[0] is not None and storage.data_ptr() not in parameters:
            saved[current[0]][storage.data_ptr()] = storage.nbytes()
        return tensor

    handles = []
    for number, layer in enumerate(model.encoder.layers):
        handles.append(layer.register_forward_pre_hook(lambda module, args, number=number: current.__setitem__(0, number)))
        handles.append(layer.register_forward_hook(lambda module, args, output: current.__setitem__(0, None)))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(**inputs)
    for handle in handles:
        handle.remove()
    # The side inputs (masks, relative ids, links) are built once per pass: every layer saves the same storages.
    counts = collections.Counter(pointer for layer in saved for pointer in layer)
    shared = {pointer for pointer, count in counts.items() if count == len(saved)}
    return [sum(size for pointer, size in layer.items() if pointer not in shared) for layer in saved]


def formula_bytes(config, batch: int, padded_length: int, num_globals: int) -> int:
    """docs/encoder.md's formula for one layer, in float32, at a batch of two rows or more."""
    hidden, heads, block = config.hidden_size, config.num_attention_heads, config.local_radius + 1
    relative = config.uses_relative_positions
    projections = 3 * hidden + (2 * hidden if config.cross_kv_projections else 0)
    per_token = 5 * hidden + projections + 2 * config.intermediate_size + 4 + (hidden if relative else 0)
    scores = heads * (padded_length * (3 * block + num_globals) + num_globals * (num_globals + padded_length))
    tables = 2 * batch * config.relative_vocab_size * hidden if relative else 0
    floats = (batch * (padded_length + num_globals) * per_token
              + batch * scores * (2 if config.talking_heads else 1) + tables)
    return FLOAT32 * floats


@pytest.mark.parametrize("switches", [
    dict(residual_attention=True), dict(residual_attention=False), dict(residual_attention=True, talking_heads=True),
    dict(residual_attention=True, cross_kv_projections=True), dict(residual_attention=True, position_embedding_type="absolute"),
], ids=["residual", "plain", "talking-heads", "cross-kv", "no-relative"])
def test_each_layer_saves_the_bytes_the_documented_formula_gives(switches):
    if cpu_kernels.failure() is not None:
        pytest.skip(f"the C++ kernels cannot be built here: {cpu_kernels.failure()}")
    torch.manual_seed(0)
    config = tiny_config(**switches)
    model = GlobalLocalModel(config).train()  # (dropout is 0 in the tiny config)
    model.set_attention_backend("cpu")
    inputs = make_inputs(2, 13, 4, padding=True, structure=True)
    padded = -(-13 // (config.local_radius + 1)) * (config.local_radius + 1)  # whole blocks of r + 1
    expected = formula_bytes(config, batch=2, padded_length=padded, num_globals=4)
    assert saved_bytes_per_layer(model, inputs) == [expected] * config.num_hidden_layers
