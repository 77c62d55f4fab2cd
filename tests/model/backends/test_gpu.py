"""The gpu backend (longdoc.model.backends.gpu) beyond what every backend is tested for
(tests/model/backends/test_backends.py runs it in the model against the dense reference, its kernels
have tests of their own in tests/model/test_gpu_kernel.py): where it runs and what it refuses, its
interpreter mode, and what it derives once per forward pass."""

import sys

import pytest
import torch

from longdoc.model.backends import gpu
from longdoc.model.backends.gpu import GpuBackend
from longdoc.model.backends.resolution import refusal
from longdoc.model.kernels.gpu import interpreting, softmax as gpu_softmax, triton_available
from tests.model.conftest import make_inputs, tiny_config
from tests.model.test_attention import make_model

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_cpu_tensors_run_only_in_the_interpreter_mode_and_not_in_bfloat16(monkeypatch):
    if not triton_available():
        pytest.skip("Triton is not installed (pip install triton)")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    # (None, unless this Triton's interpreter cannot run the kernels: then that, in one line)
    expected = gpu_softmax.interpreter_failure()
    assert GpuBackend.refusal(CPU, torch.float32) == expected and GpuBackend.refusal(CPU, torch.float16) == expected
    # (its interpreter multiplies bfloat16's bit patterns: triton-lang/triton#11584)
    assert GpuBackend.refusal(CPU, torch.bfloat16) == ("Triton's interpreter (TRITON_INTERPRET=1) multiplies bfloat16 "
                                                      "wrongly: float16 or float32 there")
    assert GpuBackend.refusal(torch.device("mps"), torch.float32) == "the GPU kernel runs on CUDA tensors only"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert GpuBackend.refusal(CPU, torch.float32) == "the GPU kernel runs on CUDA tensors only"


def test_without_triton_the_backend_says_what_is_missing(monkeypatch, without_triton_interpreter):
    monkeypatch.setattr(gpu, "triton_failure", lambda: "Triton is not installed (CUDA builds of torch ship it; else "
                                                       "`pip install triton`, Linux x86_64)")
    assert refusal("gpu", CUDA, torch.float32) == (
        "attention backend 'gpu' cannot run on cuda in float32: the GPU kernel needs Triton: Triton is not installed "
        "(CUDA builds of torch ship it; else `pip install triton`, Linux x86_64); there eager, dense can (or auto, "
        "which picks one)")


def test_a_triton_that_does_not_import_is_named(monkeypatch):
    gpu_softmax.triton_failure.cache_clear()
    monkeypatch.setattr(gpu_softmax, "triton_available", lambda: True)
    monkeypatch.setitem(sys.modules, "triton", None)  # (an import of it raises ImportError)
    try:
        assert gpu_softmax.triton_failure() == ("Triton cannot be imported (ModuleNotFoundError: import of triton "
                                                "halted; None in sys.modules)")
    finally:
        gpu_softmax.triton_failure.cache_clear()


def test_relative_ids_go_to_the_kernels_as_int32_derived_once_per_forward_pass(monkeypatch):
    # The side inputs hold int64 ids (the gradient's index type); every layer's kernels read int32 ones.
    device = CPU if interpreting() else CUDA  # (the interpreter mode: tests/conftest.py, without a CUDA GPU)
    why = GpuBackend.refusal(device, torch.float32)
    if why is not None:
        pytest.skip(why)
    seen = []
    apply = gpu.TritonSoftmax.apply
    monkeypatch.setattr(gpu.TritonSoftmax, "apply", lambda *arguments: seen.append(arguments[-1]) or apply(*arguments))
    model = make_model(tiny_config(num_hidden_layers=2)).to(device, torch.float32)
    model.set_attention_backend("gpu")
    with torch.no_grad():
        model(**{name: tensor.to(device) for name, tensor in make_inputs(1, 9, 3, padding=False, structure=True).items()})
    long_ids = [settings.kernel_ids for settings in seen if settings.window_block]
    assert len(seen) == 4 and len(long_ids) == 2 and long_ids[0] is long_ids[1]
    for settings in seen:
        assert settings.kernel_ids.dtype == torch.int32 and settings.relative_ids.dtype == torch.int64
        assert torch.equal(settings.kernel_ids.long(), settings.relative_ids)


def test_an_interpreter_that_cannot_run_the_kernels_is_refused_in_one_line(monkeypatch):
    # Triton 3.6's interpreter under numpy 2.4 cannot take a loop's bounds from tensors (every kernel
    # does): found running the tests with the GPU machine's Triton; the backend says so, the tests skip.
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    why = "Triton 3.6.0's interpreter cannot run the kernels' loops with numpy 2.4.6 (InterpreterError); Triton 3.9's can"
    monkeypatch.setattr(gpu, "interpreter_failure", lambda: why)
    message = refusal("gpu", CPU, torch.float32)
    assert message.startswith(f"attention backend 'gpu' cannot run on cpu in float32: {why}; there eager, ")
    assert message.endswith("dense can (or auto, which picks one)") and "\n" not in message
