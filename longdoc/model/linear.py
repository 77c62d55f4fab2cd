"""The encoder's CPU products, float32 (and bfloat16 where the CPU has bfloat16 instructions), on the
faster of the GEMMs torch's CPU build carries.

F.linear calls torch's BLAS, MKL on x86, which keeps to its AVX2 code on CPUs not made by Intel.
torch also carries oneDNN, which picks its code by instruction set alone, and so runs the encoder's
products faster on such CPUs when they have AVX-512. At AVX2 MKL is the faster (one thread, CPU
seconds, AMD EPYC Zen 3: 66 against 73 ms for the feed-forward's 4352 x 384 @ 384 x 1536, 50 against
56 for the projections' 384 x 1152), but its products are reproducible bit for bit only under
MKL_CBWR (cpu_blas.py): without it their last bits depend on where the operands lie in memory,
and a training run resumed from a checkpoint would not end where the uninterrupted run ends. oneDNN's
are reproducible as they are. On Intel CPUs MKL is as fast, and stays.

`backend()` is the process's choice, from LONGDOC_GEMM: "auto" (the default), "onednn" or "blas".
"auto" is "onednn" on x86 CPUs not made by Intel, except where torch runs below AVX-512 and MKL_CBWR
makes MKL reproducible (`cpu_blas.mkl_reproducible()`, which the `longdoc` command sets up
on such CPUs): "blas" there, and "blas" elsewhere. With "onednn", `Linear` (nn.Linear: the same
parameters, the same state dict) runs its float32 CPU products, forward and backward, on oneDNN. A
value that cannot be used gives one warning that says what is used instead. (The compiled attention's
own small products follow the CPU, not this choice: longdoc.model.kernels.cpu.)
`Linear` also applies its activation: fused into oneDNN's product where torch runs AVX-512 code, in
place after the product otherwise (at AVX2 oneDNN's fused GELU costs more than the product's own
writes: at 4352 x 384 @ 384 x 1536, 55 ms fused against 40 ms product then gelu_, AMD EPYC Zen 3,
2 threads). Under torch.compile and export it is nn.Linear.

bfloat16 products run on oneDNN whatever LONGDOC_GEMM says, where the CPU has bfloat16 instructions
(`bfloat16_instructions()`): torch's own bfloat16 product (F.linear) is oneDNN's too, after copying the
bias into the output, and without the activation fused.
"""

import functools
import os
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from longdoc.model import cpu_blas

ENVIRONMENT_VARIABLE = "LONGDOC_GEMM"
AUTO, ONEDNN, BLAS = "auto", "onednn", "blas"

# Activations oneDNN applies to the product as it writes it: name -> (its post-op, its algorithm).
_ONEDNN_ACTIVATIONS = {"gelu": ("gelu", "none"), "relu": ("relu", "")}  # "none": erf's gelu, as ACT2FN's
# Activations that may overwrite their input when nothing is kept for a backward: writing a fresh
# [L, 4H] tensor costs more than the activation itself.
_IN_PLACE_ACTIVATIONS = {"gelu": torch.ops.aten.gelu_, "relu": torch.relu_}


def _onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@functools.cache
def bfloat16_instructions() -> bool:
    """Whether this CPU has bfloat16 instructions (AVX512_BF16 or AMX; x86, elsewhere False) and oneDNN
    runs bfloat16 products with them (ONEDNN_MAX_CPU_ISA can withhold them; without them oneDNN
    emulates bfloat16, slower than float32)."""
    cpu = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return cpu and _onednn_available() and _onednn_uses_bfloat16_instructions()


@functools.cache
def _torch_at_avx512() -> bool:
    """Whether torch runs its AVX-512 code (ATEN_CPU_CAPABILITY can hold it to AVX2): where oneDNN's
    products beat MKL's on CPUs not made by Intel, and apply the activation as they write (see the
    module's docstring)."""
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def _onednn_uses_bfloat16_instructions() -> bool:
    return torch.ops.mkldnn._is_mkldnn_bf16_supported()


@functools.cache
def backend() -> str:
    """"onednn" or "blas": where this process's float32 CPU products run (see the module's docstring)."""
    wanted = os.environ.get(ENVIRONMENT_VARIABLE, AUTO).strip().lower() or AUTO
    if wanted not in (AUTO, ONEDNN, BLAS):
        warnings.warn(f"{ENVIRONMENT_VARIABLE}={wanted!r} is not one of {AUTO!r}, {ONEDNN!r}, {BLAS!r}; "
                      f"using {AUTO!r}", RuntimeWarning, stacklevel=2)
        wanted = AUTO
    if wanted == AUTO:
        mkl_wins = _reproducible_mkl_faster()  # (else oneDNN: the faster, or the reproducible one)
        wanted = ONEDNN if cpu_blas.mkl_keeps_to_avx2() and _onednn_available() and not mkl_wins else BLAS
    elif wanted == ONEDNN and not _onednn_available():
        warnings.warn(f"{ENVIRONMENT_VARIABLE}={ONEDNN!r}: this torch build has no oneDNN linear; using "
                      f"{BLAS!r}", RuntimeWarning, stacklevel=2)
        wanted = BLAS
    return wanted


def _reproducible_mkl_faster() -> bool:
    """Whether MKL is the faster GEMM here (torch below AVX-512, on a CPU where MKL keeps to AVX2) and
    reproducible (MKL_CBWR set: see the module's docstring)."""
    return not _torch_at_avx512() and torch.backends.mkl.is_available() and cpu_blas.mkl_reproducible()


def _on_onednn(x: Tensor, weight: Tensor) -> bool:
    """Whether oneDNN runs this product: not while torch.compile or export traces the model (the
    compiler picks its own GEMMs, and the choice reads the machine)."""
    if torch.compiler.is_compiling():
        return False
    if x.device.type != "cpu" or x.dtype != weight.dtype or x.dim() < 2 or x.numel() == 0:
        return False
    if torch.is_autocast_enabled("cpu"):
        return False
    if x.dtype == torch.bfloat16:
        return bfloat16_instructions()
    return x.dtype == torch.float32 and backend() == ONEDNN


def _onednn_product(x: Tensor, weight: Tensor, bias: Tensor | None, activation: str | None = None) -> Tensor:
    """x [..., in] @ weight [out, in]^T (+ bias) (then the activation), in oneDNN."""
    post_op, algorithm = _ONEDNN_ACTIVATIONS[activation] if activation else ("none", "")
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, post_op, [], algorithm)  # (any strides)


def product(left: Tensor, right: Tensor) -> Tensor:
    """left [m, k] @ right [k, n] on the backend Linear uses for these tensors (the benchmark's
    matmul baseline)."""
    if _on_onednn(left, right):
        return _onednn_product(left, right.t(), None)
    return torch.matmul(left, right)


class _OneDnnLinear(torch.autograd.Function):
    """x @ weight^T + bias with its backward's two products in oneDNN too."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _onednn_product(x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        x, weight = ctx.saved_tensors
        grad = grad.reshape(-1, grad.shape[-1]).contiguous()  # [N, out]
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = _onednn_product(grad, weight.t(), None).view(x.shape)  # grad @ weight
        if ctx.needs_input_grad[1]:  # grad^T @ x, both read transposed where they lie (a copy cost more)
            grad_weight = _onednn_product(grad.t(), x.reshape(-1, x.shape[-1]).t(), None)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum(0)
        return grad_x, grad_weight, grad_bias


class Linear(nn.Linear):
    """nn.Linear on `backend()`, with an optional activation (a name in transformers' ACT2FN)."""

    def forward(self, x: Tensor, activation: str | None = None) -> Tensor:
        grad = torch.is_grad_enabled()
        if _on_onednn(x, self.weight):
            if not grad and activation in _ONEDNN_ACTIVATIONS and _torch_at_avx512():
                return _onednn_product(x, self.weight, self.bias, activation)
            out = _OneDnnLinear.apply(x, self.weight, self.bias) if grad else _onednn_product(x, self.weight, self.bias)
        else:
            out = F.linear(x, self.weight, self.bias)
        if activation is None:
            return out
        if not grad and activation in _IN_PLACE_ACTIVATIONS:
            return _IN_PLACE_ACTIVATIONS[activation](out)
        # (imported here: transformers.activations imports its hub kernels, seconds at start-up, and
        # inference reaches this only with an activation that has no in-place form)
        from transformers.activations import ACT2FN

        return ACT2FN[activation](out)
