"""The blocked global-local attention against the dense reference (tests/dense_reference.py), and
the properties DESIGN promises: locality, two-hop global mixing, talking heads at initialisation."""

import itertools

import pytest
import torch

from longdoc import GlobalLocalConfig, GlobalLocalModel
from tests.model.conftest import VOCAB, make_inputs, tiny_config
from tests.model.dense_reference import dense_forward

def make_model(config: GlobalLocalConfig, seed: int = 0) -> GlobalLocalModel:
    torch.manual_seed(seed)
    model = GlobalLocalModel(config).double().eval()
    with torch.no_grad():  # non-trivial relative tables, talking heads and biases
        for name, parameter in model.named_parameters():
            if "talking_heads" in name:
                parameter.add_(0.3 * torch.randn_like(parameter))
            elif "relative" in name or name.endswith("bias"):
                parameter.normal_(0.0, 0.3)
    return model


def assert_real_positions_close(model, inputs, atol):
    """Both execution paths against the reference: with autograd (fresh tensors, in-place updates
    of the carried scores) and without (buffers reused from layer to layer)."""
    long_reference, global_reference = dense_forward(model, inputs)
    long_mask = inputs["long_attention_mask"].bool()
    for grad_enabled in (True, False):
        with torch.set_grad_enabled(grad_enabled):
            output = model(**inputs)
        torch.testing.assert_close(output.long_hidden_state[long_mask], long_reference[long_mask], atol=atol, rtol=0)
        if "global_input_ids" in inputs:
            global_mask = inputs["global_attention_mask"].bool()
            torch.testing.assert_close(
                output.global_hidden_state[global_mask], global_reference[global_mask], atol=atol, rtol=0
            )


# Lengths around the block size (r + 1 = 4): shorter than a block, exact multiples, one over.
SHAPES = [(1, 0), (3, 0), (4, 2), (5, 3), (11, 0), (12, 5), (13, 1), (30, 7)]


@pytest.mark.parametrize("length,num_globals", SHAPES)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("talking_heads", [False, True])
def test_blocked_equals_dense_over_shapes(length, num_globals, residual, talking_heads):
    model = make_model(tiny_config(residual_attention=residual, talking_heads=talking_heads))
    assert_real_positions_close(model, make_inputs(2, length, num_globals, padding=True, structure=True), atol=1e-10)


@pytest.mark.parametrize(
    "hard_g2l,hard_l2g,within_paragraph",
    [flags for flags in itertools.product([False, True], repeat=3)],
)
def test_blocked_equals_dense_over_masks(hard_g2l, hard_l2g, within_paragraph):
    config = tiny_config(hard_g2l=hard_g2l, hard_l2g=hard_l2g, local_attention_within_paragraph=within_paragraph)
    assert_real_positions_close(make_model(config), make_inputs(2, 17, 6, padding=True, structure=True), atol=1e-10)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(position_embedding_type="absolute"),
        dict(position_embedding_type="both"),
        dict(pre_layer_norm=True),
        dict(residual_attention_mean=True),
        dict(share_qkv=True, share_attention_output=True, share_feed_forward=True),
        dict(cross_kv_projections=True),
        dict(separate_global_embedding_norm=True),
        dict(local_radius=0),
        dict(local_radius=40),  # radius above the length: full attention
        dict(global_feature_size=3),
    ],
    ids=lambda overrides: ",".join(f"{key}={value}" for key, value in overrides.items()),
)
def test_blocked_equals_dense_over_options(overrides):
    model = make_model(tiny_config(**overrides))
    inputs = make_inputs(2, 14, 4, padding=True, structure=True)
    if overrides.get("global_feature_size"):
        inputs["global_features"] = torch.randn(2, 4, 3, dtype=torch.float64)
    assert_real_positions_close(model, inputs, atol=1e-10)


@pytest.mark.parametrize("hard_g2l,hard_l2g", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("structure", [False, True], ids=["no-structure", "structure"])
def test_blocked_equals_dense_for_packed_examples(hard_g2l, hard_l2g, structure):
    config = tiny_config(hard_g2l=hard_g2l, hard_l2g=hard_l2g)
    inputs = make_inputs(2, 17, 6, padding=True, structure=structure, packed=True)
    assert_real_positions_close(make_model(config), inputs, atol=1e-10)


def test_packed_examples_do_not_see_each_other():
    model = make_model(tiny_config(local_radius=40))  # a window over the whole row: only the example ids separate
    inputs = make_inputs(1, 12, 4, padding=False, structure=False, packed=True)
    changed = {name: value.clone() for name, value in inputs.items()}
    changed["long_input_ids"][0, 8] = (changed["long_input_ids"][0, 8] + 1) % VOCAB  # in the second example
    changed["global_input_ids"][0, 3] = (changed["global_input_ids"][0, 3] + 1) % VOCAB
    before, after = model(**inputs), model(**changed)
    torch.testing.assert_close(after.long_hidden_state[0, :6], before.long_hidden_state[0, :6], atol=0, rtol=0)
    torch.testing.assert_close(after.global_hidden_state[0, :2], before.global_hidden_state[0, :2], atol=0, rtol=0)
    assert not torch.allclose(after.long_hidden_state[0, 6:], before.long_hidden_state[0, 6:])


def test_example_ids_come_in_pairs():
    inputs = make_inputs(1, 8, 2, padding=False, structure=False, packed=True)
    del inputs["global_example_ids"]
    with pytest.raises(ValueError, match="long_example_ids was given alone"):
        make_model(tiny_config())(**inputs)


def test_no_structure_means_no_hard_masks():
    model = make_model(tiny_config())
    inputs = make_inputs(2, 9, 3, padding=False, structure=False)
    assert_real_positions_close(model, inputs, atol=1e-10)


def test_float32_close_to_float64_reference():
    model = make_model(tiny_config(talking_heads=True))
    inputs = make_inputs(2, 21, 5, padding=True, structure=True)
    reference_long, _ = dense_forward(model, inputs)
    output = model.float()(**inputs)
    mask = inputs["long_attention_mask"].bool()
    torch.testing.assert_close(output.long_hidden_state[mask].double(), reference_long[mask], atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "length,overrides",
    [
        (13, dict(residual_attention=True)),
        (13, dict(residual_attention=True, talking_heads=True)),
        (13, dict(residual_attention=False, talking_heads=True)),
        # clipping distance beyond the window (blocks of 2, k = 5): the clipped ids' prefix and
        # suffix sums in PickRelative's backward start before and end after the window
        (13, dict(local_radius=1, max_relative_distance=5, relative_vocab_size=14)),
        (3, dict(local_radius=40)),  # one block of the input's own length
        (13, dict(cross_kv_projections=True)),
    ],
    ids=["residual", "residual,talking", "talking", "k>window", "one-short-block", "cross-kv"],
)
def test_gradients_equal_dense_gradients(length, overrides):
    model = make_model(tiny_config(**overrides))
    inputs = make_inputs(2, length, 4, padding=True, structure=True)
    long_mask, global_mask = inputs["long_attention_mask"].bool(), inputs["global_attention_mask"].bool()
    weights = torch.randn(2, length, 16, dtype=torch.float64), torch.randn(2, 4, 16, dtype=torch.float64)

    def gradients(forward):
        model.zero_grad()
        long_hidden, global_hidden = forward()
        loss = (long_hidden * weights[0])[long_mask].sum() + (global_hidden * weights[1])[global_mask].sum()
        loss.backward()
        return {name: parameter.grad.clone() for name, parameter in model.named_parameters() if parameter.grad is not None}

    def blocked():
        output = model(**inputs)
        return output.long_hidden_state, output.global_hidden_state

    blocked_gradients = gradients(blocked)
    dense_gradients = gradients(lambda: dense_forward(model, inputs))
    assert blocked_gradients.keys() == dense_gradients.keys()
    assert any("relative_key" in name for name in blocked_gradients)
    for name in blocked_gradients:
        torch.testing.assert_close(blocked_gradients[name], dense_gradients[name], atol=1e-9, rtol=1e-7, msg=name)


def test_one_layer_sees_only_its_window():
    radius = 3
    model = make_model(tiny_config(num_hidden_layers=1, local_radius=radius))
    ids = torch.randint(1, VOCAB, (1, 40))
    base = model(ids).long_hidden_state
    for changed in (0, 20, 39):
        edited = ids.clone()
        edited[0, changed] = (edited[0, changed] % (VOCAB - 1)) + 1
        difference = (model(edited).long_hidden_state - base).abs().amax(-1)[0]
        moved = set(torch.nonzero(difference > 0).flatten().tolist())
        assert moved == {p for p in range(40) if abs(p - changed) <= radius}


def test_global_tokens_carry_information_across_the_document_in_two_layers():
    length, radius = 60, 2
    inputs = {
        "long_input_ids": torch.randint(1, VOCAB, (1, length)),
        "global_input_ids": torch.randint(1, VOCAB, (1, 6)),
        "sentence_ids": (torch.arange(length) // 10).unsqueeze(0),  # 6 sentences of 10 tokens
    }
    edited = {**inputs, "long_input_ids": inputs["long_input_ids"].clone()}
    edited["long_input_ids"][0, 0] = (edited["long_input_ids"][0, 0] % (VOCAB - 1)) + 1
    for layers, reaches_the_end in ((1, False), (2, True)):
        model = make_model(tiny_config(num_hidden_layers=layers, local_radius=radius))
        difference = (model(**edited).long_hidden_state - model(**inputs).long_hidden_state).abs()[0, -1].max()
        # layer 1: token 0 -> its sentence's global token (hard g2l); layer 2: that global -> every long token
        assert (difference > 0) == reaches_the_end


def test_talking_heads_at_initialisation_equal_plain_attention():
    # Both on the eager backend, the specification: exact equality is asked, and the compiled kernels
    # run the two through different code (tests/model/backends holds each to the reference).
    plain = GlobalLocalModel(tiny_config(attention_backend="eager")).eval()
    torch.manual_seed(3)
    talking = GlobalLocalModel(tiny_config(talking_heads=True, attention_backend="eager")).eval()
    loaded = talking.load_state_dict(plain.state_dict(), strict=False)
    assert all("talking_heads" in name for name in loaded.missing_keys) and not loaded.unexpected_keys
    inputs = make_inputs(2, 19, 5, padding=True, structure=True)
    plain_output, talking_output = plain(**inputs), talking(**inputs)
    assert torch.equal(plain_output.long_hidden_state, talking_output.long_hidden_state)
    assert torch.equal(plain_output.global_hidden_state, talking_output.global_hidden_state)
