"""The cpu backend in bfloat16 (longdoc.model.backends.upcast): each softmax is the float32 kernels'
on float32 copies of its bfloat16 operands, the context rounded back to bfloat16; a bfloat16 model
on it stays as close to the float64 dense reference (of its bfloat16 weights) as the eager backend
does, forward and, under bfloat16 autocast, backward; auto picks it for bfloat16 on the CPU."""

import dataclasses

import pytest
import torch

from longdoc.model.backends.cpu import CpuBackend
from longdoc.model.backends.eager import EagerBackend
from longdoc.model.backends.resolution import refusal, resolve_backend
from longdoc.model.backends.upcast import UpcastCpuBackend
from longdoc.model.kernels import cpu as cpu_kernels
from tests.model.backends.test_backends import CONFIGS
from tests.model.conftest import make_inputs, tiny_config
from tests.model.dense_reference import dense_forward
from tests.model.test_attention import make_model

CPU = torch.device("cpu")
BUILT = cpu_kernels.compiled() is not None
needs_kernels = pytest.mark.skipif(not BUILT, reason="the C++ kernels could not be built here")
# Measured on these inputs (hidden states of size up to 3): 0.019 at most for the cpu backend and the
# eager one alike, most of it the last layer norm's rounding to bfloat16 (its spacing is 0.016 at 2-4).
BFLOAT16_TOLERANCE = 0.04


def _bfloat16_model(overrides: dict, backend: str):
    model = make_model(tiny_config(**overrides)).to(torch.bfloat16)
    model.set_attention_backend(backend)
    return model


@needs_kernels
@pytest.mark.parametrize("overrides", [CONFIGS[name] for name in ("residual", "talking-heads", "cross-kv", "plain")],
                         ids=["residual", "talking-heads", "cross-kv", "plain"])
def test_each_softmax_is_the_float32_kernels_on_its_values(monkeypatch, overrides):
    calls = []
    attend = UpcastCpuBackend.attend
    monkeypatch.setattr(UpcastCpuBackend, "attend",
                        lambda self, operands: calls.append((operands, attend(self, operands))) or calls[-1][1])
    model = _bfloat16_model(overrides, "cpu")
    model(**make_inputs(2, 17, 6, padding=True, structure=True))  # (with autograd: nothing written over)
    assert len(calls) == 2 * model.config.num_hidden_layers
    for number, (operands, result) in enumerate(calls):
        assert operands.own.dtype == torch.bfloat16 and result.context.dtype == torch.bfloat16
        as_float32 = lambda tensor: None if tensor is None else tensor.float()
        expected = CpuBackend().attend(dataclasses.replace(operands, **{
            field: as_float32(getattr(operands, field))
            for field in ("own", "other", "mask_bias", "relative_key", "relative_bias", "carried",
                          "talking_heads_pre", "talking_heads_post")}))
        assert torch.equal(result.context, expected.context.to(torch.bfloat16))
        if number >= len(calls) - 2:  # the last layer's sums go nowhere: not written
            assert result.summed is None
        elif overrides.get("residual_attention", True):  # (the kernels skip keys the mask forbids)
            allowed = (operands.mask_bias == 0).expand_as(expected.summed)
            assert result.summed.dtype == torch.float32
            assert torch.equal(result.summed[allowed], expected.summed[allowed])


@needs_kernels
@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
def test_a_bfloat16_model_is_as_close_to_the_dense_reference_as_on_the_eager_backend(overrides):
    inputs = make_inputs(2, 17, 6, padding=True, structure=True)
    long_mask, global_mask = inputs["long_attention_mask"].bool(), inputs["global_attention_mask"].bool()
    # The reference: the model's weights rounded to bfloat16, then every step in float64.
    long_reference, global_reference = dense_forward(
        make_model(tiny_config(**overrides)).to(torch.bfloat16).double(), inputs)
    for grad_enabled in (True, False):  # fresh tensors / buffers handed from layer to layer
        for backend in ("cpu", "eager"):
            with torch.set_grad_enabled(grad_enabled):
                output = _bfloat16_model(overrides, backend)(**inputs)
            assert output.long_hidden_state.dtype == torch.bfloat16
            torch.testing.assert_close(output.long_hidden_state.double()[long_mask], long_reference[long_mask],
                                       atol=BFLOAT16_TOLERANCE, rtol=0, msg=backend)
            torch.testing.assert_close(output.global_hidden_state.double()[global_mask],
                                       global_reference[global_mask], atol=BFLOAT16_TOLERANCE, rtol=0, msg=backend)


@needs_kernels
def test_under_bfloat16_autocast_the_gradients_stay_close_to_the_dense_references():
    # What `train --bf16` runs on the CPU: float32 weights, bfloat16 products, the kernels' backward.
    overrides = CONFIGS["residual"]
    inputs = make_inputs(2, 13, 4, padding=True, structure=True, packed=True)
    long_mask, global_mask = inputs["long_attention_mask"].bool(), inputs["global_attention_mask"].bool()
    generator = torch.Generator().manual_seed(0)
    weights = (torch.randn(2, 13, 16, generator=generator, dtype=torch.float64),
               torch.randn(2, 4, 16, generator=generator, dtype=torch.float64))

    def gradients(model, forward) -> dict:
        long_hidden, global_hidden = (hidden.double() for hidden in forward(model))
        ((long_hidden * weights[0])[long_mask].sum() + (global_hidden * weights[1])[global_mask].sum()).backward()
        return {name: p.grad.double() for name, p in model.named_parameters() if p.grad is not None}

    def autocast(model):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output = model(**inputs)
        return output.long_hidden_state, output.global_hidden_state

    chosen = []
    attend = UpcastCpuBackend.attend
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(UpcastCpuBackend, "attend", lambda self, operands: chosen.append(1) or attend(self, operands))
        got = gradients(make_model(tiny_config(**overrides)).float(), autocast)
    assert chosen  # auto picked the kernels for the bfloat16 projections
    expected = gradients(make_model(tiny_config(**overrides)), lambda model: dense_forward(model, inputs))
    assert got.keys() == expected.keys()
    for name in got:
        scale = expected[name].abs().max().item()
        # bfloat16 keeps 8 bits: 3% of the largest gradient of each parameter (measured: at most 1%)
        torch.testing.assert_close(got[name], expected[name], atol=0.03 * scale, rtol=0, msg=name)


def test_auto_picks_the_kernels_for_bfloat16_on_the_cpu_and_float16_is_refused_by_name(without_triton_interpreter):
    assert resolve_backend("auto", CPU, torch.bfloat16) is (UpcastCpuBackend if BUILT else EagerBackend)
    assert resolve_backend("auto", CPU, torch.float16) is EagerBackend
    if BUILT:
        assert resolve_backend("cpu", CPU, torch.bfloat16) is UpcastCpuBackend
        assert resolve_backend("cpu", CPU, torch.float32) is CpuBackend
    assert refusal("cpu", CPU, torch.float16) == (
        "attention backend 'cpu' cannot run on cpu in float16: the C++ kernels run on the CPU in float32, and in "
        "bfloat16 on float32 copies; there eager, dense can (or auto, which picks one)")
