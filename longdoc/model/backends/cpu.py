"""The cpu backend: each softmax whole in the compiled C++ kernels (longdoc.model.kernels.cpu), CPU
float32, forward and backward.

The kernels read q, k and v where the projection wrote them and write the context where the output
projection reads it: no key windows are copied, and the scores and weights stay in cache but for
what is carried or kept for the backward. What they need beyond the operands is derived here, once
per forward pass (a host read costs nothing on the CPU): the relative ids as int32, their index
type, and for the global softmax the range of long keys each query may see (hard g2l leaves a
sentence's global token its own tokens), so that the kernel skips the rest. The kernels are
torch operators (longdoc::cpu_softmax, its backward, and the variant that writes over the carried
scores), so that torch.compile keeps them inside the graphs it compiles.
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
from longdoc.model.side_inputs import RelativeIdLayout


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


# The kernels as torch operators (namespace "longdoc"), so that torch.compile traces a model on the
# cpu backend whole, the kernels inside its graph: the operators take their settings as plain
# arguments (an operator's schema has no records), their fake implementations give the outputs'
# shapes, and the backward is an operator of its own. Registered on this module's first import (a
# second import registers them again, as torch allows); `import longdoc` alone registers nothing.
# An output that is not wanted is an empty tensor (an operator returns no None).


def _run_forward(own: Tensor, other: Tensor, relative: Tensor | None, carried: Tensor | None, pre: Tensor | None,
                 post: Tensor | None, mask_bias: Tensor, kernel_ids: Tensor | None, keep: Tensor | None,
                 key_ranges: Tensor | None, num_heads: int, window_block: int, scale: float, keep_scale: float,
                 summed: Tensor | None, probs: Tensor | None) -> Tensor:
    """Run the forward kernel, writing the summed scores and the weights into `summed` and `probs`
    (either may be None: not written); returns the context [B, Nq, H]."""
    batch, num_queries, width = own.shape
    context = own.new_empty(batch, num_queries, num_heads, width // (3 * num_heads))
    # Per-head tensors as [B, h, Nq, N]; the ids and the mask, shared by the heads, as [B, Nq, N].
    rows = functools.partial(_query_rows, batch=batch, num_queries=num_queries)
    shared = lambda tensor: None if tensor is None else tensor.view(batch, num_queries, -1)
    arguments = dict(
        kernel_keys(own, other, num_heads, window_block), relative=rows(relative), ids=shared(kernel_ids),
        carried=rows(carried), mask_bias=shared(mask_bias), scale=scale, keep=rows(keep), keep_scale=keep_scale,
        summed_out=rows(summed), probs_out=rows(probs), context_out=context.transpose(1, 2), key_ranges=key_ranges,
    )
    if pre is not None:
        kernels.compiled().talking_heads_forward(**arguments, pre=pre.contiguous(), post=post.contiguous())
    else:
        kernels.compiled().attention_forward(**arguments)
    return context.view(batch, num_queries, -1)


def _scores_shape(mask_bias: Tensor, num_heads: int) -> torch.Size:
    return torch.Size((mask_bias.shape[0], num_heads, *mask_bias.shape[2:]))


def _context_shape(own: Tensor) -> torch.Size:
    return torch.Size((*own.shape[:-1], own.shape[-1] // 3))


@torch.library.custom_op("longdoc::cpu_softmax", mutates_args=(), device_types="cpu")
def softmax_operator(own: Tensor, other: Tensor, relative: Tensor | None, carried: Tensor | None, pre: Tensor | None,
                     post: Tensor | None, mask_bias: Tensor, kernel_ids: Tensor | None, keep: Tensor | None,
                     key_ranges: Tensor | None, relative_ids: Tensor | None, links: Tensor | None, num_heads: int,
                     window_block: int, scale: float, keep_scale: float, max_distance: int, summed_wanted: bool,
                     probs_wanted: bool, probs_zeroed: bool) -> tuple[Tensor, Tensor, Tensor]:
    """One softmax (compiled_softmax's arguments, KernelSettings' fields flattened; `relative_ids`,
    `links` and `max_distance`, the relative layout's, for the backward): (context, summed scores,
    weights), the last two empty unless wanted."""
    shape = _scores_shape(mask_bias, num_heads)
    summed = own.new_empty(shape) if summed_wanted else None
    probs = None
    if probs_wanted:  # (zeroed where the kernel skips columns, key ranges, and the caller reads them all)
        probs = own.new_zeros(shape) if probs_zeroed else own.new_empty(shape)
    context = _run_forward(own, other, relative, carried, pre, post, mask_bias, kernel_ids, keep, key_ranges,
                           num_heads, window_block, scale, keep_scale, summed, probs)
    return context, own.new_empty(0) if summed is None else summed, own.new_empty(0) if probs is None else probs


@softmax_operator.register_fake
def _(own, other, relative, carried, pre, post, mask_bias, kernel_ids, keep, key_ranges, relative_ids, links,
      num_heads, window_block, scale, keep_scale, max_distance, summed_wanted, probs_wanted, probs_zeroed):
    shape = _scores_shape(mask_bias, num_heads)
    return (own.new_empty(_context_shape(own)), own.new_empty(shape if summed_wanted else 0),
            own.new_empty(shape if probs_wanted else 0))


@torch.library.custom_op("longdoc::cpu_softmax_over_carried", mutates_args=("carried",), device_types="cpu")
def softmax_over_carried_operator(own: Tensor, other: Tensor, relative: Tensor | None, carried: Tensor,
                                  pre: Tensor | None, post: Tensor | None, mask_bias: Tensor,
                                  kernel_ids: Tensor | None, keep: Tensor | None, key_ranges: Tensor | None,
                                  num_heads: int, window_block: int, scale: float, keep_scale: float,
                                  probs_wanted: bool) -> tuple[Tensor, Tensor]:
    """softmax_operator without autograd, its summed scores written over `carried` (nothing reads
    those again: no score-sized buffer is allocated for them): (context, weights or empty)."""
    probs = own.new_empty(_scores_shape(mask_bias, num_heads)) if probs_wanted else None
    context = _run_forward(own, other, relative, carried, pre, post, mask_bias, kernel_ids, keep, key_ranges,
                           num_heads, window_block, scale, keep_scale, carried, probs)
    return context, own.new_empty(0) if probs is None else probs


@softmax_over_carried_operator.register_fake
def _(own, other, relative, carried, pre, post, mask_bias, kernel_ids, keep, key_ranges, num_heads, window_block,
      scale, keep_scale, probs_wanted):
    return (own.new_empty(_context_shape(own)),
            own.new_empty(_scores_shape(mask_bias, num_heads) if probs_wanted else 0))


@torch.library.custom_op("longdoc::cpu_softmax_backward", mutates_args=(), device_types="cpu")
def softmax_backward_operator(own: Tensor, other: Tensor, probs: Tensor, keep: Tensor | None, summed: Tensor | None,
                              pre: Tensor | None, post: Tensor | None, grad_context: Tensor,
                              grad_summed: Tensor | None, key_ranges: Tensor | None, num_heads: int,
                              window_block: int, scale: float,
                              keep_scale: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The gradients of softmax_operator's inputs: (own, other, the scores (the carried and the
    relative terms'), pre, post), the mixes' empty without talking heads."""
    batch, num_queries, _ = own.shape
    grad_own, grad_other = torch.zeros_like(own), torch.zeros_like(other)
    grads = kernel_keys(grad_own, grad_other, num_heads, window_block)
    rows = functools.partial(_query_rows, batch=batch, num_queries=num_queries)
    grad_scores = torch.empty_like(probs)
    arguments = dict(
        kernel_keys(own, other, num_heads, window_block), probs=rows(probs), keep=rows(keep), keep_scale=keep_scale,
        grad_context=grad_context.contiguous().view(batch, num_queries, num_heads, -1).transpose(1, 2),
        grad_summed=rows(None if grad_summed is None else grad_summed.contiguous()), scale=scale,
        grad_scores_out=rows(grad_scores), grad_query=grads["query"], grad_first_keys=grads["first_keys"],
        grad_first_values=grads["first_values"], grad_second_keys=grads["second_keys"],
        grad_second_values=grads["second_values"], key_ranges=key_ranges,
    )
    if pre is None:
        kernels.compiled().attention_backward(**arguments)
        return grad_own, grad_other, grad_scores, own.new_empty(0), own.new_empty(0)
    grad_pre, grad_post = torch.zeros_like(pre), torch.zeros_like(post)
    kernels.compiled().talking_heads_backward(**arguments, summed=rows(summed), pre=pre.contiguous(),
                                              post=post.contiguous(), grad_pre=grad_pre, grad_post=grad_post)
    return grad_own, grad_other, grad_scores, grad_pre, grad_post


@softmax_backward_operator.register_fake
def _(own, other, probs, keep, summed, pre, post, grad_context, grad_summed, key_ranges, num_heads, window_block,
      scale, keep_scale):
    mixes = (torch.empty_like(pre), torch.empty_like(post)) if pre is not None else (own.new_empty(0),) * 2
    return torch.empty_like(own), torch.empty_like(other), torch.empty_like(probs), *mixes


def _save_for_backward(ctx, inputs, output) -> None:
    (own, other, relative, carried, pre, post, mask_bias, kernel_ids, keep, key_ranges, relative_ids, links,
     num_heads, window_block, scale, keep_scale, max_distance, summed_wanted, probs_wanted, probs_zeroed) = inputs
    _, summed, probs = output
    ctx.mark_non_differentiable(probs)
    ctx.set_materialize_grads(False)  # (an unused summed output's gradient stays None: no zeros read)
    ctx.save_for_backward(own, other, probs, keep, summed if pre is not None else None, pre, post, key_ranges,
                          relative_ids, links)
    ctx.num_heads, ctx.window_block, ctx.scale, ctx.keep_scale = num_heads, window_block, scale, keep_scale
    ctx.layout = RelativeIdLayout(max_distance) if relative is not None else None
    ctx.relative_shape = None if relative is None else relative.shape


def _backward(ctx, grad_context: Tensor | None, grad_summed: Tensor | None, grad_probs: None):
    own, other, probs, keep, summed, pre, post, key_ranges, relative_ids, links = ctx.saved_tensors
    if grad_context is None:
        grad_context = torch.zeros(_context_shape(own), dtype=own.dtype)
    if grad_summed is not None and grad_summed.numel() == 0:
        grad_summed = None
    grad_own, grad_other, grad_scores, grad_pre, grad_post = softmax_backward_operator(
        own, other, probs, keep, summed, pre, post, grad_context, grad_summed, key_ranges, ctx.num_heads,
        ctx.window_block, ctx.scale, ctx.keep_scale)
    grad_relative = None
    if ctx.relative_shape is not None and ctx.needs_input_grad[2]:
        grad_relative = relative_gradient(grad_scores, relative_ids, links, ctx.layout, ctx.window_block or None,
                                          ctx.relative_shape)
    grad_carried = grad_scores if ctx.needs_input_grad[3] else None
    talking = pre is not None
    return (grad_own, grad_other, grad_relative, grad_carried, grad_pre if talking else None,
            grad_post if talking else None) + (None,) * 14


softmax_operator.register_autograd(_backward, setup_context=_save_for_backward)


def compiled_softmax(own: Tensor, other: Tensor, relative: Tensor | None, carried: Tensor | None,
                     pre: Tensor | None, post: Tensor | None,
                     settings: KernelSettings) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """One softmax from projections to context in the compiled kernels: the queries of `own` [B, Nq,
    3H] over the first keys (its own) and the second keys (all of `other`'s: [B, N2, 3H], the other
    stream's fused projection, or [B, N2, 2H], a cross projection); `relative` [B, h, ..., Nq, R] the
    relative terms of every id, `carried` the carried scores, the talking-heads mixes `pre`, `post`
    [h, h] (any may be None). Returns (context [B, Nq, H], summed scores or None, weights or None).

    Nothing score-sized is allocated but the carried sum, and when autograd records the call what
    the backward (compiled too) needs: the weights, dropout's mask, and with talking heads the summed
    scores. Without autograd the summed scores are written over the carried ones (unless the weights are kept).
    """
    talking = pre is not None
    differentiable = any(tensor is not None and tensor.requires_grad for tensor in (own, other, relative, carried, pre, post))
    for_backward = settings.records_graph and differentiable
    # The kernel applies dropout to the weights it keeps: kept in train mode without autograd too.
    probs_wanted = for_backward or settings.drop_probability > 0 or settings.keep_weights
    summed_wanted = settings.keep_summed or (for_backward and talking)  # (talking heads' backward reads them)
    keep, keep_scale = None, 1.0
    if settings.drop_probability > 0:
        keep, realised = keep_mask(_scores_shape(settings.mask_bias, settings.num_heads), settings.drop_probability)
        keep, keep_scale = keep.view(torch.uint8), kept_scale(realised)
    operands = dict(own=own, other=other, relative=relative, pre=pre, post=post, mask_bias=settings.mask_bias,
                    kernel_ids=settings.kernel_ids, keep=keep, key_ranges=settings.key_ranges,
                    num_heads=settings.num_heads, window_block=settings.window_block, scale=settings.scale,
                    keep_scale=keep_scale)
    # Written over the carried scores where nothing reads those again: kept weights come with both.
    if summed_wanted and carried is not None and not for_backward and not settings.keep_weights:
        context, probs = softmax_over_carried_operator(**operands, carried=carried, probs_wanted=probs_wanted)
        summed = carried
    else:
        layout = settings.layout
        context, summed, probs = softmax_operator(
            **operands, carried=carried, relative_ids=settings.relative_ids, links=settings.links,
            max_distance=0 if layout is None else layout.max_distance, summed_wanted=summed_wanted,
            probs_wanted=probs_wanted,
            # (with key ranges the kernel writes no weight in the columns it skips: 0)
            probs_zeroed=settings.keep_weights and settings.key_ranges is not None)
    return context, summed if settings.keep_summed else None, probs if settings.keep_weights else None


def global_key_ranges(mask_bias: Tensor, first_keys: int, always: bool = False) -> Tensor | None:
    """[B, G, 2] int32: the second keys [first, last + 1) each query of the unblocked softmax whose
    mask is `mask_bias` [B, 1, G, N1 + N2] may attend to (N1 = `first_keys`), so that the kernel skips
    the rest; a query that sees no second key gets (0, 0), one that sees no key at all every key (its
    softmax is uniform over them, as in the eager backend); None when the ranges leave little to skip
    (the kernel then takes wider chunks of queries), unless `always` (under tracing, where deciding
    would read the mask on the host)."""
    allowed = mask_bias[:, 0] == 0  # [B, G, N1 + N2]
    second_allowed = allowed[..., first_keys:].to(torch.int8)
    length = second_allowed.shape[-1]
    sees_second, sees_nothing = second_allowed.any(-1), ~allowed.any(-1)
    first = second_allowed.argmax(-1).masked_fill(~sees_second, 0)
    last = (length - second_allowed.flip(-1).argmax(-1)).masked_fill(~sees_second, 0).masked_fill(sees_nothing, length)
    if not always and (last - first).float().mean() > length / 2:  # little to skip: the kernel's wider chunks do better
        return None
    return torch.stack([first, last], dim=-1).to(torch.int32)


# (under tracing, the build's outcome as it is when the trace is made: tracing its file reads fails)
_build_failure = torch.compiler.assume_constant_result(kernels.failure)


class CpuBackend(AttentionBackend):
    name = "cpu"

    @classmethod
    def refusal(cls, device: torch.device, dtype: torch.dtype) -> str | None:
        if device.type != "cpu" or dtype != torch.float32:
            return "the C++ kernels run on the CPU in float32 only"
        failure = _build_failure()
        return None if failure is None else f"the C++ kernels could not be built here ({failure})"

    def attend(self, operands: SoftmaxOperands) -> SoftmaxResult:
        first_keys = operands.own.shape[1]
        settings = KernelSettings.of(
            operands, self.derived(operands.relative_ids, "int32", lambda ids: ids.to(torch.int32)),
            key_ranges=None if operands.window_block else self.derived(
                operands.mask_bias, "ranges",
                lambda mask: global_key_ranges(mask, first_keys, torch.compiler.is_compiling())),
        )
        context, summed, weights = compiled_softmax(
            operands.own, operands.other, operands.relative_terms_by_id(), operands.carried,
            operands.talking_heads_pre, operands.talking_heads_post, settings)
        return SoftmaxResult(context, summed, weights)
