"""The gpu backend: each softmax in the fused Triton kernels of longdoc.model.kernels.gpu
(`TritonSoftmax`), CUDA tensors in bfloat16, float16 or float32, forward and backward.

The kernels read q, k and v where the projections wrote them and keep nothing score-sized but the
summed scores residual attention carries: the backward recomputes the weights from each row's
statistics, as flash attention does. What they need beyond the operands is derived here once per
forward pass: the relative ids as int32.

Weights on request (`keep_weights`, for inspection) are computed apart, by the eager backend from
the same operands without autograd: a second computation of each softmax, only when asked.

Interpreter mode: with TRITON_INTERPRET=1 in the environment before Triton is imported, Triton's
interpreter runs the kernels on CPU tensors (float32 and float16; it multiplies bfloat16 wrongly,
triton-lang/triton#11584), so the backend runs on the CPU too, slowly: for checks without a GPU
(the tests do). `auto` never picks it there.
"""

from dataclasses import replace

import torch

from longdoc.model.backends.base import AttentionBackend, KernelSettings, SoftmaxOperands, SoftmaxResult
from longdoc.model.backends.eager import EagerBackend
from longdoc.model.kernels.gpu import TritonSoftmax, interpreter_failure, interpreting, triton_failure

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class GpuBackend(AttentionBackend):
    name = "gpu"

    @classmethod
    def refusal(cls, device: torch.device, dtype: torch.dtype) -> str | None:
        interpreted = device.type == "cpu" and interpreting()
        if device.type != "cuda" and not interpreted:
            return "the GPU kernel runs on CUDA tensors only"
        if dtype not in DTYPES:
            return "the GPU kernel takes bfloat16, float16 or float32 tensors"
        if interpreted and dtype == torch.bfloat16:
            return "Triton's interpreter (TRITON_INTERPRET=1) multiplies bfloat16 wrongly: float16 or float32 there"
        why = triton_failure()
        if why is not None:
            return f"the GPU kernel needs Triton: {why}"
        why = interpreted and interpreter_failure()
        if why:
            return why
        if (dtype == torch.bfloat16 and device.type == "cuda" and torch.cuda.is_available()
                and torch.cuda.get_device_capability(device) < (8, 0)):  # (bfloat16 tensor cores: Ampere's)
            return "the GPU kernel takes bfloat16 on GPUs of compute capability 8.0 or more: float16 or float32 here"
        return None

    def attend(self, operands: SoftmaxOperands) -> SoftmaxResult:
        settings = KernelSettings.of(
            operands, self.derived(operands.relative_ids, "int32", lambda ids: ids.to(torch.int32)))
        context, summed = TritonSoftmax.apply(
            operands.own, operands.other, operands.relative_terms_by_id(), operands.carried,
            operands.talking_heads_pre, operands.talking_heads_post, settings)
        weights = None
        if operands.keep_weights:
            with torch.no_grad():  # (weights are for inspection: no gradient flows through them)
                weights = EagerBackend().attend(
                    replace(operands, drop_probability=0.0, keep_summed=False)).weights
        return SoftmaxResult(context, summed, weights)

