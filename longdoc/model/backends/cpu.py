"""The cpu backend: each softmax whole in the compiled C++ kernels (longdoc.model.kernels.cpu), CPU
float32, forward and backward.

The kernels read q, k and v where the projection wrote them and write the context where the output
projection reads it: no key windows are copied, and the scores and weights stay in cache but for
what is carried or kept for the backward. What they need beyond the operands is derived here, once
per forward pass (a host read costs nothing on the CPU): the relative ids as int32, their index
type, and for the global softmax the range of long keys each query may see (hard g2l leaves a
sentence's global token its own tokens), so that the kernel skips the rest.
"""

import functools
import math

import torch
from torch import Tensor

from longdoc.model.backends.base import (
    AttentionBackend, KernelSettings, SoftmaxOperands, SoftmaxResult, projection_heads,
)
from longdoc.model.backends.relative import relative_gradient
from longdoc.model.dropout import keep_mask, kept_scale
from longdoc.model.kernels import cpu as kernels


def _query_rows(tensor: Tensor | None, batch: int, num_queries: int) -> Tensor | None:
    """[B, h, ..., Nq, N] (blocked or not) -> [B, h, Nq, N], as the kernels read per-head tensors."""
    return None if tensor is None else tensor.view(batch, -1, num_queries, tensor.shape[-1])


def kernel_keys(own: Tensor, other: Tensor, heads: int, window_block: int) -> dict:
    """The queries and keys of one softmax as the kernels take them (views [B, h, N, d] where the
    projections wrote them): the queries of `own` [B, Nq, 3H], its keys and values first (with
    `window_block` b: the window of 3b keys around each block of b queries), then all of `other`'s
    keys and values ([B, N2, 3H] or [B, N2, 2H])."""
    query, first_keys, first_values, second_keys, second_values = projection_heads(own, other, heads)
    return dict(query=query, query_scale=1.0 / math.sqrt(query.shape[-1]), first_keys=first_keys,
                first_values=first_values, window_block=window_block, second_keys=second_keys,
                second_values=second_values)


class CompiledSoftmax(torch.autograd.Function):
    """One softmax from projections to context in the compiled kernels: the queries of `own` [B, Nq,
    3H] over the first keys (its own) and the second keys (all of `other`'s: [B, N2, 3H], the other
    stream's fused projection, or [B, N2, 2H], a cross projection); `relative` [B, h, ..., Nq, R] the
    relative terms of every id, `carried` the carried scores, the talking-heads mixes `pre`, `post`
    [h, h] (any may be None). Returns (context [B, Nq, H], summed scores or None, weights or None).

    Nothing score-sized is allocated but the carried sum, and when autograd records the call what
    the backward (compiled too) needs: the weights, dropout's mask, and with talking heads the summed
    scores. Without autograd the summed scores are written over the carried ones (unless the weights are kept).
    """

    @staticmethod
    def forward(ctx, own: Tensor, other: Tensor, relative: Tensor | None, carried: Tensor | None,
                pre: Tensor | None, post: Tensor | None, settings: KernelSettings):
        batch, num_queries, width = own.shape
        heads, talking = settings.num_heads, pre is not None
        for_backward = settings.records_graph and any(ctx.needs_input_grad[:6])
        # The kernel applies dropout to the weights it keeps: kept in train mode without autograd too.
        keeps_weights = for_backward or settings.drop_probability > 0 or settings.keep_weights
        scores_shape = torch.Size((batch, heads, *settings.mask_bias.shape[2:]))
        summed = None
        if settings.keep_summed or (for_backward and talking):  # (talking heads' backward reads them)
            # Written over the carried scores where nothing reads those again: kept weights come with both.
            overwrite = carried is not None and not for_backward and not settings.keep_weights
            summed = carried if overwrite else own.new_empty(scores_shape)
        probs = None
        if keeps_weights:  # (with key ranges the kernel writes no weight in the columns it skips: 0)
            wanted_whole = settings.keep_weights and settings.key_ranges is not None
            probs = own.new_zeros(scores_shape) if wanted_whole else own.new_empty(scores_shape)
        keep, keep_scale = None, 1.0
        if settings.drop_probability > 0:
            keep, realised = keep_mask(scores_shape, settings.drop_probability)
            keep, keep_scale = keep.view(torch.uint8), kept_scale(realised)
        context = own.new_empty(batch, num_queries, heads, width // (3 * heads))
        # Per-head tensors as [B, h, Nq, N]; the ids and the mask, shared by the heads, as [B, Nq, N].
        rows = functools.partial(_query_rows, batch=batch, num_queries=num_queries)
        shared = lambda tensor: None if tensor is None else tensor.view(batch, num_queries, -1)
        arguments = dict(
            kernel_keys(own, other, heads, settings.window_block), relative=rows(relative),
            ids=shared(settings.kernel_ids), carried=rows(carried), mask_bias=shared(settings.mask_bias),
            scale=settings.scale, keep=rows(keep), keep_scale=keep_scale, summed_out=rows(summed),
            probs_out=rows(probs), context_out=context.transpose(1, 2), key_ranges=settings.key_ranges,
        )
        if talking:
            kernels.compiled().talking_heads_forward(**arguments, pre=pre.contiguous(), post=post.contiguous())
        else:
            kernels.compiled().attention_forward(**arguments)
        if for_backward:
            ctx.save_for_backward(own, other, probs, keep, summed if talking else None, pre, post)
            ctx.settings, ctx.keep_scale = settings, keep_scale
            ctx.relative_shape = None if relative is None else relative.shape
        weights = probs if settings.keep_weights else None
        if weights is not None:
            ctx.mark_non_differentiable(weights)
        return context.view(batch, num_queries, -1), summed if settings.keep_summed else None, weights

    @staticmethod
    def backward(ctx, grad_context: Tensor, grad_summed: Tensor | None, grad_weights: None):
        own, other, probs, keep, summed, pre, post = ctx.saved_tensors
        settings, heads = ctx.settings, ctx.settings.num_heads
        batch, num_queries, _ = own.shape
        grad_own, grad_other = torch.zeros_like(own), torch.zeros_like(other)
        grads = kernel_keys(grad_own, grad_other, heads, settings.window_block)
        rows = functools.partial(_query_rows, batch=batch, num_queries=num_queries)
        grad_scores = torch.empty_like(probs)
        arguments = dict(
            kernel_keys(own, other, heads, settings.window_block), probs=rows(probs), keep=rows(keep),
            keep_scale=ctx.keep_scale,
            grad_context=grad_context.contiguous().view(batch, num_queries, heads, -1).transpose(1, 2),
            grad_summed=rows(None if grad_summed is None else grad_summed.contiguous()), scale=settings.scale,
            grad_scores_out=rows(grad_scores), grad_query=grads["query"], grad_first_keys=grads["first_keys"],
            grad_first_values=grads["first_values"], grad_second_keys=grads["second_keys"],
            grad_second_values=grads["second_values"], key_ranges=settings.key_ranges,
        )
        grad_pre = grad_post = None
        if pre is None:
            kernels.compiled().attention_backward(**arguments)
        else:
            grad_pre, grad_post = torch.zeros_like(pre), torch.zeros_like(post)
            kernels.compiled().talking_heads_backward(**arguments, summed=rows(summed), pre=pre.contiguous(),
                                                      post=post.contiguous(), grad_pre=grad_pre, grad_post=grad_post)
        grad_relative = None
        if ctx.relative_shape is not None and ctx.needs_input_grad[2]:
            grad_relative = relative_gradient(grad_scores, settings.relative_ids, settings.links, settings.layout,
                                              settings.window_block or None, ctx.relative_shape)
        grad_carried = grad_scores if ctx.needs_input_grad[3] else None
        return grad_own, grad_other, grad_relative, grad_carried, grad_pre, grad_post, None


def global_key_ranges(mask_bias: Tensor, first_keys: int) -> Tensor | None:
    """[B, G, 2] int32: the second keys [first, last + 1) each query of the unblocked softmax whose
    mask is `mask_bias` [B, 1, G, N1 + N2] may attend to (N1 = `first_keys`), so that the kernel skips
    the rest; a query that sees no second key gets (0, 0), one that sees no key at all every key (its
    softmax is uniform over them, as in the eager backend); None when the ranges leave little to skip
    (the kernel then takes wider chunks of queries)."""
    allowed = mask_bias[:, 0] == 0  # [B, G, N1 + N2]
    second_allowed = allowed[..., first_keys:].to(torch.int8)
    length = second_allowed.shape[-1]
    sees_second, sees_nothing = second_allowed.any(-1), ~allowed.any(-1)
    first = second_allowed.argmax(-1).masked_fill(~sees_second, 0)
    last = (length - second_allowed.flip(-1).argmax(-1)).masked_fill(~sees_second, 0).masked_fill(sees_nothing, length)
    if (last - first).float().mean() > length / 2:  # little to skip: the kernel's wider chunks do better
        return None
    return torch.stack([first, last], dim=-1).to(torch.int32)


class CpuBackend(AttentionBackend):
    name = "cpu"

    @classmethod
    def refusal(cls, device: torch.device, dtype: torch.dtype) -> str | None:
        if device.type != "cpu" or dtype != torch.float32:
            return "the C++ kernels run on the CPU in float32 only"
        failure = kernels.failure()
        return None if failure is None else f"the C++ kernels could not be built here ({failure})"

    def attend(self, operands: SoftmaxOperands) -> SoftmaxResult:
        first_keys = operands.own.shape[1]
        settings = KernelSettings.of(
            operands, self.derived(operands.relative_ids, "int32", lambda ids: ids.to(torch.int32)),
            key_ranges=None if operands.window_block else self.derived(
                operands.mask_bias, "ranges", lambda mask: global_key_ranges(mask, first_keys)),
        )
        context, summed, weights = CompiledSoftmax.apply(
            operands.own, operands.other, operands.relative_terms_by_id(), operands.carried,
            operands.talking_heads_pre, operands.talking_heads_post, settings)
        return SoftmaxResult(context, summed, weights)
