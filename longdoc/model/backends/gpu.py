"""The gpu backend: each softmax in the fused Triton kernels of longdoc.model.kernels.gpu, CUDA
tensors in bfloat16, float16 or float32, forward and backward (`TritonSoftmax`, an autograd
function; the cpu backend's compiled_softmax calls its kernels as torch operators).

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

import contextlib
from dataclasses import replace

import torch
from torch import Tensor

from longdoc.model.backends.base import (
    AttentionBackend, KernelSettings, SoftmaxOperands, SoftmaxResult, projection_heads,
)
from longdoc.model.backends.eager import EagerBackend
from longdoc.model.backends.relative import relative_gradient
from longdoc.model.kernels.gpu import (
    HeadGradients, SoftmaxTensors, dropout_for, interpreter_failure, interpreting, run_backward, run_forward,
    triton_failure,
)

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _rows_in_place(tensor: Tensor) -> Tensor:
    """`tensor` if its last dimension is contiguous (the kernels read rows of d elements), else a copy."""
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()


def _softmax_tensors(own_qkv: Tensor, other: Tensor, relative: Tensor | None, carried: Tensor | None,
                     settings: KernelSettings) -> SoftmaxTensors:
    """One softmax's tensors as the kernels read them; ValueError where the mask's width is not the keys'."""
    batch, num_queries, _ = own_qkv.shape
    heads = settings.num_heads
    query, first_keys, first_values, second_keys, second_values = projection_heads(
        _rows_in_place(own_qkv), _rows_in_place(other), heads)
    relative = None if relative is None else _rows_in_place(relative)
    # Per-head tensors as [B, h, Nq, ...]; the ids and the mask, shared by the heads, as [B, Nq, N].
    rows = lambda tensor: None if tensor is None else tensor.reshape(batch, heads, num_queries, tensor.shape[-1])
    shared = lambda tensor: None if tensor is None else tensor.reshape(batch, num_queries, -1).contiguous()
    tensors = SoftmaxTensors(query, first_keys, first_values, second_keys, second_values, rows(relative),
                             shared(settings.kernel_ids), shared(settings.mask_bias),
                             None if carried is None else rows(carried).contiguous(), settings.window_block, heads)
    if tensors.mask.shape[-1] != tensors.width:
        raise ValueError(f"mask_bias has {tensors.mask.shape[-1]} keys per query, the keys give {tensors.width} "
                         f"(first piece {tensors.first_width}, second {second_keys.shape[2]})")
    return tensors


def _device_of(tensor: Tensor):
    """Triton launches on the current CUDA device: make it the tensors' (a no-op on the CPU)."""
    return torch.cuda.device(tensor.device) if tensor.is_cuda else contextlib.nullcontext()


class TritonSoftmax(torch.autograd.Function):
    """One softmax from projections to context on the GPU kernels, called as
    `TritonSoftmax.apply(own_qkv, other, relative, carried, pre, post, settings)`: the queries of
    `own_qkv` [B, Nq, 3H] over the first keys (its own: with settings.window_block b > 0 the window
    of 3b keys around each block of b queries, else all) and the second keys (all of `other`'s:
    [B, N2, 3H] the other stream's fused projection, or [B, N2, 2H] a cross projection); `relative`
    [B, h, ..., Nq, R] the relative terms of every id, `carried` scores [B, h, ..., Nq, N], the
    talking-heads mixes `pre`, `post` [h, h] (any may be None). Returns (context [B, Nq, H], the
    summed scores [B, h, ..., Nq, N] or None).

    `settings` is read for num_heads, window_block, mask_bias [B, 1, ..., Nq, N], kernel_ids (the
    relative ids as the kernels read them, int32, like the mask), relative_ids, links and layout
    (the relative terms' gradient), scale (the running mean's), keep_summed (residual attention:
    return the summed scores), drop_probability and records_graph (the caller's grad mode).
    keep_weights and key_ranges are not read: the kernels keep no weights (the backend computes
    them where asked), and score every key.
    """

    @staticmethod
    def forward(ctx, own_qkv: Tensor, other: Tensor, relative: Tensor | None, carried: Tensor | None,
                pre: Tensor | None, post: Tensor | None, settings: KernelSettings):
        if (relative is None) != (settings.kernel_ids is None):
            raise ValueError("relative terms and their ids come together: "
                             f"relative {'given' if relative is not None else 'None'}, kernel_ids "
                             f"{'given' if settings.kernel_ids is not None else 'None'}")
        tensors = _softmax_tensors(own_qkv, other, relative, carried, settings)
        for_backward = settings.records_graph and any(ctx.needs_input_grad[:6])
        summed = None
        if settings.keep_summed:
            # Without a backward to follow, the sums are written over the carried scores they replace.
            reuse = carried is not None and not for_backward and carried.is_contiguous()
            summed = carried if reuse else own_qkv.new_empty(
                (tensors.batch, tensors.heads, *settings.mask_bias.shape[2:]))
        dropout = dropout_for(settings.drop_probability)
        with _device_of(own_qkv):
            context, row_max, row_sum = run_forward(
                tensors, pre, post, settings.scale, None if summed is None else summed.view(tensors.scores_shape),
                dropout)
        if for_backward:
            # With residual attention the backward reads the summed scores (which the next layer
            # keeps as its carried ones) instead of computing them again from these.
            recomputed = (None, None) if summed is not None else (relative, carried)
            ctx.save_for_backward(own_qkv, other, *recomputed, pre, post, None if pre is not None else context,
                                  row_max, row_sum, summed)
            ctx.settings, ctx.dropout = settings, dropout
            ctx.relative_shape = None if relative is None else relative.shape
            ctx.carried_shape = None if carried is None else carried.shape
        batch, num_queries, width3 = own_qkv.shape
        return context.view(batch, num_queries, width3 // 3), summed

    @staticmethod
    def backward(ctx, grad_context: Tensor, grad_summed: Tensor | None):
        own_qkv, other, relative, carried, pre, post, context, row_max, row_sum, summed = ctx.saved_tensors
        settings = ctx.settings
        tensors = _softmax_tensors(own_qkv, other, relative, carried, settings)
        needs = ctx.needs_input_grad
        want_relative = ctx.relative_shape is not None and needs[2]
        want_carried = ctx.carried_shape is not None and needs[3]
        rows = tensors.scores_shape
        grad_own = torch.zeros(own_qkv.shape, dtype=torch.float32, device=own_qkv.device)
        grad_other = torch.zeros(other.shape, dtype=torch.float32, device=other.device)
        with _device_of(own_qkv):
            gradients = run_backward(
                tensors, HeadGradients(*projection_heads(grad_own, grad_other, tensors.heads)), pre, post,
                None if summed is None else summed.view(rows),
                None if context is None else context.view(*own_qkv.shape[:2], tensors.heads, -1), row_max, row_sum,
                grad_context.contiguous().view(*own_qkv.shape[:2], tensors.heads, -1),
                None if grad_summed is None else grad_summed.reshape(rows).contiguous(), settings.scale, ctx.dropout,
                want_relative or want_carried)
        grad_relative = grad_carried = None
        if want_relative:
            # Summed by the ids' structure, from the summed scores' gradient blocked as the scores are.
            blocked = gradients.scores.view(tensors.batch, tensors.heads, *settings.mask_bias.shape[2:])
            grad_relative = relative_gradient(blocked, settings.relative_ids, settings.links, settings.layout,
                                              settings.window_block or None, ctx.relative_shape)
        if want_carried:
            grad_carried = gradients.scores.view(ctx.carried_shape)
        cast = lambda grad, like: None if grad is None else grad.to(like.dtype)
        return (cast(grad_own, own_qkv), cast(grad_other, other), grad_relative, grad_carried,
                cast(gradients.pre, pre), cast(gradients.post, post), None)


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

