"""The gpu backend: each softmax in the fused Triton kernel of longdoc.model.kernels.gpu (CUDA).

An adapter only: the kernel module provides `attention(**arguments)`, an autograd-aware function
taking the operands by the names of the C++ kernels' entry points (`kernel_keys`: query,
query_scale, first_keys, first_values, window_block, second_keys, second_values, as views [B, h,
N, d] where the projections wrote them; relative [B, h, Nq, R] and ids (int32) [B, Nq, N], or None;
carried [B, h, Nq, N] or None; mask_bias [B, Nq, N]; scale; pre and post [h, h] or None; key_ranges
None) and the settings drop_probability, keep_summed and keep_weights, and returning (context [B,
Nq, H], summed [B, h, Nq, N] or None, weights [B, h, Nq, N] or None). Until the module exists the
backend is refused with the reason, and `auto` does not pick it.
"""

import functools
import importlib
from types import ModuleType

import torch

from longdoc.model.backends.base import AttentionBackend, SoftmaxOperands, SoftmaxResult, relative_terms
from longdoc.model.backends.cpu import kernel_keys

KERNEL_MODULE = "longdoc.model.kernels.gpu"


@functools.cache
def kernel_module() -> tuple[ModuleType | None, str | None]:
    """(the GPU kernel's module, None), or (None, why it is not available)."""
    try:
        module = importlib.import_module(KERNEL_MODULE)
    except ImportError as error:  # the module, or Triton, missing
        return None, f"{KERNEL_MODULE} cannot be imported ({error})"
    if not callable(getattr(module, "attention", None)):
        return None, f"{KERNEL_MODULE} has no attention() entry point"
    return module, None


class GpuBackend(AttentionBackend):
    name = "gpu"

    @classmethod
    def refusal(cls, device: torch.device, dtype: torch.dtype) -> str | None:
        if device.type != "cuda":
            return "the GPU kernel runs on CUDA tensors only"
        module, why = kernel_module()
        return None if module is not None else f"the GPU attention kernel is not available: {why}"

    def attend(self, operands: SoftmaxOperands) -> SoftmaxResult:
        batch, num_queries, _ = operands.own.shape
        b = operands.window_block
        rows = lambda tensor: None if tensor is None else tensor.reshape(batch, -1, num_queries, tensor.shape[-1])
        relative = ids = None
        if operands.relative_ids is not None:
            query = operands.heads()[0]  # unscaled: the kernel scales q.k
            relative = relative_terms(query if b == 0 else query.unflatten(2, (-1, b)), operands.relative_key,
                                      operands.relative_bias, operands.query_scale)
            ids = self.derived(operands.relative_ids, "int32", lambda ids: ids.to(torch.int32))
            ids = ids.view(batch, num_queries, -1)
        context, summed, weights = kernel_module()[0].attention(
            **kernel_keys(operands.own, operands.other, operands.num_heads, b), relative=rows(relative), ids=ids,
            carried=rows(operands.carried), mask_bias=operands.mask_bias.view(batch, num_queries, -1),
            scale=operands.scale, pre=operands.talking_heads_pre, post=operands.talking_heads_post, key_ranges=None,
            drop_probability=operands.drop_probability, keep_summed=operands.keep_summed,
            keep_weights=operands.keep_weights,
        )
        shape = operands.scores_shape
        return SoftmaxResult(context, None if summed is None else summed.view(shape),
                             None if weights is None else weights.view(shape))
