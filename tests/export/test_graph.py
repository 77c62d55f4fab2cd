"""The export of an encoder of each architecture variant: the ONNX graph against the PyTorch model
(eager attention) at several lengths it was not traced at, with and without global tokens, padding
in the batch, packed rows, and inputs left out (their neutral values); opsets the graph cannot be
written in are refused, naming the operator."""

import pytest
import torch

from longdoc import GlobalLocalModel
from longdoc.export.check import TOLERANCE, check_lengths, compare, compare_batch
from longdoc.export.graph import OpsetError, _converted, traced_length
from longdoc.export.signature import NEUTRAL, PositionalGraph, sample_batch, signature_of
from tests.export.conftest import VARIANTS
from tests.model.conftest import tiny_config

def assert_graph_matches(model, session, signature, inputs, expected_model_inputs=None) -> None:
    """The graph on `inputs` gives the model's outputs on `expected_model_inputs` (default the same),
    within TOLERANCE on real tokens."""
    reference = dict(inputs) if expected_model_inputs is None else expected_model_inputs

    class ModelOn(torch.nn.Module):  # the model on the reference inputs, called as the flat graph is
        def forward(self, *_):
            output = model(**reference)
            return tuple(getattr(output, name) for name in signature.outputs)

    check = compare_batch(ModelOn(), session, signature, inputs)
    assert max(check.max_difference.values()) < TOLERANCE, check


@pytest.fixture(scope="module", params=VARIANTS, ids=list(VARIANTS))
def exported(request, exported_variant):
    return exported_variant(request.param)


@pytest.mark.slow
def test_graph_gives_the_models_outputs_at_lengths_it_was_not_traced_at(exported):
    model, signature, session = exported
    lengths = check_lengths(model.config)
    block = model.config.local_radius + 1
    assert len(lengths) >= 3 and traced_length(model.config) not in lengths
    assert any(length < block for length in lengths) and any(length % block for length in lengths)
    checks = compare(model, session, signature)
    assert {(check.length, check.num_globals) for check in checks} == {(n, g) for n in lengths for g in (5, 0)}
    for check in checks:
        assert max(check.max_difference.values()) < TOLERANCE, check
    # More lengths than the checks': every one from 2 to long_max_len in steps, and batches of 1 and 3.
    for length, batch in ((2, 1), (4, 3), (17, 3), (33, 1), (model.config.long_max_len, 3)):
        assert_graph_matches(model, session, signature,
                             sample_batch(signature, model.config, length=length, num_globals=4, batch=batch, seed=length))


@pytest.mark.slow
def test_packed_rows_and_inputs_left_out_give_the_models_outputs(exported):
    model, signature, session = exported
    assert_graph_matches(model, session, signature,
                         sample_batch(signature, model.config, length=23, num_globals=6, seed=3, packed=True))
    # Each input with a neutral value: the graph given that value = the model given nothing.
    inputs = sample_batch(signature, model.config, length=23, num_globals=6, seed=4)
    for name, value in NEUTRAL.items():
        given = dict(inputs)
        given[name] = torch.full_like(inputs[name], value)
        absent = {key: tensor for key, tensor in inputs.items() if key != name}
        if name in ("long_example_ids", "global_example_ids"):  # (given together, or not at all)
            absent = {key: tensor for key, tensor in absent.items() if not key.endswith("example_ids")}
        assert_graph_matches(model, session, signature, given, expected_model_inputs=absent)


def test_the_exported_program_and_the_flat_wrapper_agree_with_the_model():
    # (fast) PositionalGraph passes the inputs by name and returns the outputs in the signature's order
    torch.manual_seed(0)
    model = GlobalLocalModel(tiny_config()).eval()
    signature = signature_of(model)
    inputs = sample_batch(signature, model.config, length=9, num_globals=3)
    with torch.no_grad():
        long_hidden, global_hidden = PositionalGraph(model, signature)(*inputs.values())
        expected = model(**inputs)
    assert signature.outputs == ("long_hidden_state", "global_hidden_state")
    torch.testing.assert_close(long_hidden, expected.long_hidden_state, atol=0, rtol=0)
    torch.testing.assert_close(global_hidden, expected.global_hidden_state, atol=0, rtol=0)


def test_check_lengths_include_one_over_4096_where_the_model_takes_it():
    config = tiny_config(long_max_len=16384, max_position_embeddings=64, local_radius=84)
    lengths = check_lengths(config)
    assert any(length > 4096 for length in lengths) and 16384 in lengths
    assert any(length % 85 for length in lengths) and any(length < 85 for length in lengths)
    assert traced_length(config) not in lengths


def test_an_opset_the_graph_cannot_be_written_in_is_refused_naming_the_operator():
    import onnx
    from onnx import TensorProto, helper

    # LayerNormalization came in opset 17: a graph of one, written in 18, cannot go to 16.
    node = helper.make_node("LayerNormalization", ["x", "scale"], ["y"], axis=-1)
    graph = helper.make_graph([node], "norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
                                               helper.make_tensor_value_info("scale", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(OpsetError, match=r"--opset 16: ONNX's version converter cannot take operator LayerNormalization to opset 16"):
        _converted(model, 16)
    assert {entry.domain: entry.version for entry in _converted(model, 17).opset_import}[""] == 17
    onnx.checker.check_model(_converted(model, 17))
