"""The forward pass reads no tensor on the host: it runs on the "meta" device (where a read raises),
torch.compile traces it whole (fullgraph) with the outputs and gradients of the uncompiled model
(aot_eager, and inductor with the C++ kernels inside),
and torch.export exports it with a dynamic long length, the exported program giving the model's
outputs at other lengths, shorter than one block included."""

import pytest
import torch

from longdoc import GlobalLocalModel
from tests.model.conftest import make_inputs, tiny_config

# Two layers (tiny_config has three): the second reads the scores the first carries, which is all that
# a third layer would trace and compile again.
LAYERS = dict(num_hidden_layers=2)
CONFIG = dict(talking_heads=True, residual_attention=True, cross_kv_projections=True)


def model_and_inputs(length: int = 13, seed: int = 0):
    torch.manual_seed(seed)
    model = GlobalLocalModel(tiny_config(**CONFIG, **LAYERS)).eval()
    return model, make_inputs(2, length, 4, padding=True, structure=True)


def assert_same_outputs(got, expected, atol: float) -> None:
    torch.testing.assert_close(got.long_hidden_state, expected.long_hidden_state, atol=atol, rtol=0)
    torch.testing.assert_close(got.global_hidden_state, expected.global_hidden_state, atol=atol, rtol=0)


def test_forward_reads_no_tensor_on_the_host():
    # On "meta" tensors have shapes and no values: int(), bool() or .item() of one raises. (The value
    # checks run on CPU inputs only; the backend auto chooses there is eager.)
    model, inputs = model_and_inputs()
    model = model.to("meta")
    output = model(**{name: value.to("meta") for name, value in inputs.items()})
    assert output.long_hidden_state.shape == (2, 13, 16) and output.global_hidden_state.shape == (2, 4, 16)


@pytest.mark.slow
def test_torch_compile_traces_the_whole_forward_and_backward():
    # fullgraph: any graph break is an error. aot_eager traces the forward and the backward graphs
    # (AOTAutograd) and runs them with torch's own kernels; the inductor test below compiles them.
    model, inputs = model_and_inputs()
    model.train()  # (dropout is 0 in the tiny config: train mode changes what autograd keeps)
    weights = torch.randn(2, 13, 16), torch.randn(2, 4, 16)

    def loss(output):  # (a weighted sum: the sum of squares of a LayerNorm's output hardly moves)
        return (output.long_hidden_state * weights[0]).sum() + (output.global_hidden_state * weights[1]).sum()

    expected = model(**inputs)
    loss(expected).backward()
    expected_grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    got = compiled(**inputs)
    loss(got).backward()
    assert_same_outputs(got, expected, atol=1e-6)
    assert expected_grads.keys() == {name for name, p in model.named_parameters() if p.grad is not None}
    for name, grad in expected_grads.items():
        torch.testing.assert_close(dict(model.named_parameters())[name].grad, grad, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.slow
def test_export_with_a_dynamic_length_gives_the_models_outputs_at_other_lengths():
    # Exported at 13 long tokens; run at 3 (shorter than a block of r + 1 = 4: the exported program
    # pads it to two blocks), 8 (whole blocks) and 30. (A Dim with a range of its own is refused:
    # torch's solver cannot prove the padding arithmetic's guards, which hold at every length.)
    model, inputs = model_and_inputs(13)
    dynamic = {name: ({1: torch.export.Dim.DYNAMIC} if value.shape[1] == 13 else None) for name, value in inputs.items()}
    with torch.no_grad():
        program = torch.export.export(model, (), inputs, dynamic_shapes=dynamic, strict=False)
        for other_length in (3, 8, 30):
            _, other = model_and_inputs(other_length)
            assert_same_outputs(program.module()(**other), model(**other), atol=1e-5)


def outputs_and_gradients(model, inputs: dict, backend: str, compile_backend: str | None = None):
    """The model's outputs and its parameters' gradients of a weighted sum of them, on attention
    `backend`, compiled whole (fullgraph) with `compile_backend` if given."""
    model.set_attention_backend(backend)
    model.zero_grad()
    run = model if compile_backend is None else torch.compile(model, fullgraph=True, backend=compile_backend)
    output = run(**inputs)
    generator = torch.Generator().manual_seed(3)
    weights = (torch.randn(output.long_hidden_state.shape, generator=generator),
               torch.randn(output.global_hidden_state.shape, generator=generator))
    ((output.long_hidden_state * weights[0]).sum() + (output.global_hidden_state * weights[1]).sum()).backward()
    return output, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.slow
@pytest.mark.parametrize("compile_backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("config", [CONFIG, dict(residual_attention=True), {}], ids=["talking", "residual", "plain"])
def test_torch_compile_keeps_the_cpu_kernels_inside_with_the_eager_backends_results(compile_backend, config):
    # The kernels are torch operators (longdoc::cpu_softmax, its backward): fullgraph traces through
    # them, and the compiled graph calls them, forward and backward.
    from longdoc.model.kernels import cpu as cpu_kernels

    if cpu_kernels.failure() is not None:
        pytest.skip(f"the C++ kernels cannot be built here: {cpu_kernels.failure()}")
    torch.manual_seed(0)
    model = GlobalLocalModel(tiny_config(**config, **LAYERS)).train()
    inputs = make_inputs(2, 13, 4, padding=True, structure=True)
    expected, expected_grads = outputs_and_gradients(model, inputs, "eager")
    torch._dynamo.reset()
    with torch.autograd.profiler.profile() as profile:
        got, grads = outputs_and_gradients(model, inputs, "cpu", compile_backend)
    calls = {event.name for event in profile.function_events}
    assert {"longdoc::cpu_softmax", "longdoc::cpu_softmax_backward"} <= calls
    assert_same_outputs(got, expected, atol=1e-5)
    assert grads.keys() == expected_grads.keys()
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)
    # Without autograd the summed scores are written over the carried ones (an operator that mutates them).
    # Compiled as the config leaves it (auto, which picks the kernels under torch.compile on the CPU): the
    # outputs of the uncompiled model on the kernels and on the eager backend.
    model.eval()
    with torch.no_grad():
        model.set_attention_backend("eager")
        expected = model(**inputs)
        model.set_attention_backend("cpu")
        uncompiled = model(**inputs)
        model.set_attention_backend(None)
        with torch.autograd.profiler.profile() as profile:
            got = torch.compile(model, fullgraph=True, backend=compile_backend)(**inputs)
    assert any(event.name.startswith("longdoc::cpu_softmax") for event in profile.function_events)
    assert_same_outputs(got, uncompiled, atol=1e-5)
    assert_same_outputs(got, expected, atol=1e-5)
