"""Linear on both backends against nn.Linear (outputs and gradients), the activation it applies,
and how LONGDOC_GEMM, MKL_CBWR and the CPU choose the backend."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN

from longdoc import GlobalLocalModel
from longdoc.cli import main
from longdoc.model import cpu_blas, linear
from tests.model.conftest import make_inputs, tiny_config

needs_onednn = pytest.mark.skipif(not linear._onednn_available(), reason="this torch build has no oneDNN linear")
BACKENDS = [pytest.param(linear.ONEDNN, marks=needs_onednn), linear.BLAS]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(2, 7, 12), (5, 12), (0, 12)])
def test_outputs_and_gradients_match_nn_linear(linear_backend, backend, shape):
    linear_backend(backend)
    assert linear.backend() == backend
    torch.manual_seed(0)
    reference = torch.nn.Linear(12, 9)
    layer = linear.Linear(12, 9)
    layer.load_state_dict(reference.state_dict())
    x = torch.randn(*shape, requires_grad=True)
    x_reference = x.detach().clone().requires_grad_()
    out, expected = layer(x), reference(x_reference)
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(expected)
    out.backward(grad)
    expected.backward(grad)
    torch.testing.assert_close(x.grad, x_reference.grad)
    torch.testing.assert_close(layer.weight.grad, reference.weight.grad)
    torch.testing.assert_close(layer.bias.grad, reference.bias.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_inputs_and_expanded_gradients(linear_backend, backend):
    linear_backend(backend)
    torch.manual_seed(0)
    layer = linear.Linear(6, 4, bias=False)
    x = torch.randn(8, 3, 6).transpose(0, 1).requires_grad_()  # [3, 8, 6], not contiguous
    layer(x).sum().backward()  # sum's backward hands an expanded (stride 0) gradient
    torch.testing.assert_close(x.grad, layer.weight.sum(0).expand(3, 8, 6))
    torch.testing.assert_close(layer.weight.grad, x.detach().sum((0, 1)).expand(4, 6))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("activation", ["gelu", "relu", "gelu_new"])
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("fused", [False, True])  # (oneDNN fuses it at AVX-512 only: both on any CPU)
def test_the_activation_is_the_transformers_one(linear_backend, monkeypatch, backend, activation, grad, fused):
    # Fused into oneDNN's product, in place, or applied as a module: the same values.
    linear_backend(backend)
    monkeypatch.setattr(linear, "_torch_at_avx512", lambda: fused)
    torch.manual_seed(0)
    layer = linear.Linear(16, 32)
    x = torch.randn(3, 10, 16)
    with torch.set_grad_enabled(grad):
        out = layer(x, activation=activation)
        expected = ACT2FN[activation](F.linear(x, layer.weight, layer.bias))
    torch.testing.assert_close(out, expected)


def test_the_model_gives_the_same_outputs_and_gradients_on_both_backends(linear_backend):
    if not linear._onednn_available():
        pytest.skip("this torch build has no oneDNN linear")
    torch.manual_seed(0)
    model = GlobalLocalModel(tiny_config(residual_attention=True)).train()
    inputs = make_inputs(2, 30, 5, padding=True, structure=True)
    results = {}
    for backend in (linear.BLAS, linear.ONEDNN):
        linear_backend(backend)
        model.zero_grad()
        output = model(**inputs)
        (output.long_hidden_state.pow(2).sum() + output.global_hidden_state.sum()).backward()
        with torch.no_grad():
            inference = model(**inputs).long_hidden_state
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        results[backend] = (output.long_hidden_state.detach(), inference, grads)
    (torch_out, torch_inference, torch_grads), (onednn_out, onednn_inference, onednn_grads) = results.values()
    torch.testing.assert_close(onednn_out, torch_out)
    torch.testing.assert_close(onednn_inference, torch_inference)
    assert onednn_grads.keys() == torch_grads.keys()
    for name in torch_grads:
        torch.testing.assert_close(onednn_grads[name], torch_grads[name], msg=name, rtol=1e-4, atol=1e-5)


def _at_offset(tensor: torch.Tensor, offset: int) -> torch.Tensor:
    """A copy of `tensor` that starts `offset` floats into a fresh buffer (0: where torch aligns it)."""
    buffer = torch.empty(tensor.numel() + 16, dtype=tensor.dtype)
    return buffer[offset:offset + tensor.numel()].view(tensor.shape).copy_(tensor)


@pytest.mark.parametrize("backend", [pytest.param(linear.ONEDNN, marks=needs_onednn), linear.AUTO])
@pytest.mark.parametrize(("rows", "inputs", "outputs"), [(64, 384, 2), (100, 37, 37), (4, 384, 384), (1, 32, 3)])
def test_the_products_give_the_same_bits_wherever_the_operands_lie(linear_backend, backend, rows, inputs, outputs):
    # oneDNN, and what auto picks here (MKL on an AVX2 CPU not made by Intel: tests/conftest.py sets
    # MKL_CBWR as the command does), must not depend on the operands' alignment: a training run resumed
    # from a checkpoint ends on the uninterrupted run's weights only if it does. MKL's sgemm fails this
    # without MKL_CBWR (64 x 384 on 2 x 384: 12 of the 15 offsets differ on an AMD EPYC Zen 3).
    linear_backend(backend)
    if linear.backend() == linear.BLAS and not cpu_blas.mkl_reproducible():
        pytest.skip(f"auto picks BLAS here without {cpu_blas.ENVIRONMENT_VARIABLE} (an Intel CPU, or not x86): "
                    "not held to this")
    torch.manual_seed(0)
    x, weight, bias, grad = torch.randn(rows, inputs), torch.randn(outputs, inputs), torch.randn(outputs), torch.randn(rows, outputs)
    layer = linear.Linear(inputs, outputs)
    results = []
    for offset in range(16):
        layer.weight.data = _at_offset(weight, (7 * offset) % 16)
        layer.bias.data = bias.clone()
        layer.zero_grad(set_to_none=True)
        x_here = _at_offset(x, offset).requires_grad_()
        out = layer(x_here)
        out.backward(_at_offset(grad, (3 * offset) % 16))
        with torch.inference_mode():
            inference = layer(_at_offset(x, offset), activation="gelu")
        results.append((out.detach(), inference, x_here.grad, layer.weight.grad))
    for offset, result in enumerate(results[1:], start=1):
        for name, got, expected in zip(("output", "inference", "input grad", "weight grad"), result, results[0]):
            assert torch.equal(got, expected), f"{name} differs at offset {offset}"


@pytest.mark.parametrize(("machine", "vendor", "avx512", "cbwr", "expected"), [
    ("x86_64", "AuthenticAMD", True, "AVX2", linear.ONEDNN),  # oneDNN's AVX-512 code is the faster
    ("x86_64", "AuthenticAMD", False, "", linear.ONEDNN),  # MKL the faster, but not reproducible
    ("x86_64", "AuthenticAMD", False, "COMPATIBLE", linear.ONEDNN),  # reproducible, a third of the speed
    ("x86_64", "AuthenticAMD", False, "AVX2", linear.BLAS),
    ("x86_64", "AuthenticAMD", False, " avx2,strict ", linear.BLAS),
    ("x86_64", "AuthenticAMD", False, "AUTO", linear.BLAS),
    ("x86_64", "GenuineIntel", True, "", linear.BLAS),
    ("x86_64", "GenuineIntel", False, "", linear.BLAS),
    ("aarch64", "", False, "", linear.BLAS),
    ("AMD64", "AMD64 Family 25 Model 1 Stepping 1, AuthenticAMD", True, "", linear.ONEDNN),  # Windows
])
def test_auto_picks_onednn_on_x86_cpus_not_made_by_intel_unless_mkl_is_faster_and_reproducible(
        linear_backend, monkeypatch, machine, vendor, avx512, cbwr, expected):
    monkeypatch.setattr(cpu_blas.platform, "machine", lambda: machine)
    monkeypatch.setattr(cpu_blas, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(linear, "_onednn_available", lambda: True)
    monkeypatch.setattr(linear, "_torch_at_avx512", lambda: avx512)
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: True)
    monkeypatch.setenv(cpu_blas.ENVIRONMENT_VARIABLE, cbwr)
    linear_backend("auto")
    assert linear.backend() == expected
    for named in (linear.ONEDNN, linear.BLAS):  # the named settings whatever the CPU and MKL_CBWR
        linear_backend(named)
        assert linear.backend() == named


AMD_ZEN3_FLAGS = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma bmi2"
AMD_ZEN5_FLAGS = AMD_ZEN3_FLAGS + " avx512f avx512dq avx512bw avx512vl avx512_bf16"


@pytest.mark.parametrize(("vendor", "flags", "capability", "expected"), [
    ("AuthenticAMD", AMD_ZEN3_FLAGS, None, "AVX2"),
    ("AuthenticAMD", AMD_ZEN5_FLAGS, None, None),  # oneDNN's AVX-512 code: left alone
    ("AuthenticAMD", AMD_ZEN5_FLAGS, "avx2", "AVX2"),  # torch held to AVX2, as on an AVX2 CPU
    ("HygonGenuine", AMD_ZEN3_FLAGS, None, "AVX2"),
    ("GenuineIntel", AMD_ZEN3_FLAGS, None, None),
    ("AuthenticAMD", None, None, None),  # flags unknown
])
def test_the_command_sets_mkl_cbwr_where_mkl_keeps_to_avx2_and_torch_to_avx2(monkeypatch, vendor, flags,
                                                                            capability, expected):
    lines = [f"vendor_id\t: {vendor}"] + ([f"flags\t\t: {flags}"] if flags is not None else [])
    monkeypatch.setattr(cpu_blas, "_cpuinfo_lines", lambda: lines)
    monkeypatch.setattr(cpu_blas, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(cpu_blas.platform, "machine", lambda: "x86_64")
    if capability is None:
        monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    else:
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)
    # Set before it is removed: monkeypatch.delenv of an unset variable records nothing, and what the
    # command sets below would outlive the test.
    monkeypatch.setenv(cpu_blas.ENVIRONMENT_VARIABLE, "")
    monkeypatch.delenv(cpu_blas.ENVIRONMENT_VARIABLE)
    with pytest.raises(SystemExit):
        main(["--version"])
    assert os.environ.get(cpu_blas.ENVIRONMENT_VARIABLE) == expected
    monkeypatch.setenv(cpu_blas.ENVIRONMENT_VARIABLE, "COMPATIBLE")  # the user's own value stays
    cpu_blas.configure_blas()
    assert os.environ[cpu_blas.ENVIRONMENT_VARIABLE] == "COMPATIBLE"


def test_importing_the_library_leaves_mkl_cbwr_alone():
    # Only the application's entry point may change the process's environment; without MKL_CBWR,
    # auto stays on oneDNN where it would otherwise pick MKL.
    script = ("import os\nfrom longdoc.model import linear\nfrom longdoc.model.kernels import cpu\n"
              f"print({cpu_blas.ENVIRONMENT_VARIABLE!r} in os.environ, linear.backend())")
    env = {name: value for name, value in os.environ.items()
           if name not in (cpu_blas.ENVIRONMENT_VARIABLE, linear.ENVIRONMENT_VARIABLE)}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    x86_not_intel = cpu_blas.mkl_keeps_to_avx2() and linear._onednn_available()
    assert run.stdout.split() == ["False", linear.ONEDNN if x86_not_intel else linear.BLAS]


def test_a_setting_that_cannot_be_used_warns_once_and_says_what_is_used(linear_backend, monkeypatch):
    linear_backend("fastest")
    with pytest.warns(RuntimeWarning, match="LONGDOC_GEMM='fastest' is not one of .* using 'auto'"):
        assert linear.backend() in (linear.ONEDNN, linear.BLAS)
    monkeypatch.setattr(linear, "_onednn_available", lambda: False)
    linear_backend("onednn")
    with pytest.warns(RuntimeWarning, match="no oneDNN linear; using 'blas'"):
        assert linear.backend() == linear.BLAS



@pytest.mark.parametrize("backend", BACKENDS)
def test_product_is_the_matrix_product(linear_backend, backend):
    # The benchmark's matmul baseline times this product on the backend Linear uses.
    linear_backend(backend)
    torch.manual_seed(0)
    left, right = torch.randn(33, 20), torch.randn(20, 17)
    torch.testing.assert_close(linear.product(left, right), left @ right)


@pytest.mark.parametrize("backend", [linear.ONEDNN, linear.BLAS])
@pytest.mark.parametrize("activation", [None, "gelu", "relu"])  # (fused into the product)
def test_bfloat16_products_run_on_onednn_with_the_cpus_instructions_and_round_once(linear_backend, monkeypatch,
                                                                                  backend, activation):
    if not linear.bfloat16_instructions():
        pytest.skip("this CPU has no bfloat16 instructions (AVX512_BF16 or AMX) that oneDNN uses")
    linear_backend(backend)  # (LONGDOC_GEMM chooses the float32 products' GEMM only)
    ran = []
    product = linear._onednn_product
    monkeypatch.setattr(linear, "_onednn_product", lambda *args: ran.append(1) or product(*args))
    torch.manual_seed(0)
    layer = linear.Linear(96, 80).to(torch.bfloat16)
    x = torch.randn(3, 40, 96, dtype=torch.bfloat16)
    with torch.no_grad():
        out = layer(x, activation=activation)
    assert ran and out.dtype == torch.bfloat16
    # The float64 product of the bfloat16 operands, rounded once to bfloat16: within half its spacing
    # (2^-9 relative) and the float32 accumulation's error. A bfloat16 accumulator (up to 0.047 off
    # here), or the bias added after rounding the product (0.011), fails this.
    exact = F.linear(x.double(), layer.weight.double(), layer.bias.double())
    exact = exact if activation is None else ACT2FN[activation](exact)
    torch.testing.assert_close(out.double(), exact, rtol=2 ** -8, atol=1e-3)


def test_bfloat16_products_without_the_instructions_are_torchs(linear_backend, monkeypatch):
    # Without them oneDNN would emulate bfloat16: F.linear there (and the commands refuse bfloat16 on such CPUs).
    monkeypatch.setattr(linear, "bfloat16_instructions", lambda: False)
    linear_backend(linear.ONEDNN)
    monkeypatch.setattr(linear, "_onednn_product", lambda *args: pytest.fail("oneDNN ran a bfloat16 product"))
    layer = linear.Linear(8, 4).to(torch.bfloat16)
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=0, rtol=0)
