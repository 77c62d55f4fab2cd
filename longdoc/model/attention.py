"""Global-local attention: ETC's four pieces as two softmaxes, blocked, with residual scores.

References:
- ETC (Ainslie et al., 2020, arXiv:2004.08483): a long query attends over its local window (l2l)
  and all global tokens (l2g) in one softmax; a global query over all global (g2g) and all long
  tokens (g2l) in another. Relative positions: score = (q.k + q.E[id] + b[id]) / sqrt(d).
- RealFormer (He et al., 2020, arXiv:2012.11747): each layer adds the previous layer's raw
  (unmasked, pre-softmax) scores to its own; the mask is applied to a copy for the softmax.
- Talking-Heads Attention (Shazeer et al., 2020, arXiv:2003.02436): learned h x h mixing of the
  logits across heads before the softmax and of the weights after it.

The long softmax is computed in blocks of b = r + 1 queries: a query block sees its previous, own
and next key blocks (3b keys, trimmed to the exact window by the mask) plus the G global keys, so
scores are [B, h, nb, b, 3b + G] and memory is linear in the length. There is no loop over blocks:
each piece is one batched matmul. Scores carried between layers keep these blocked shapes. The
parameters each softmax has of its own (relative tables, talking-heads mixes) are a submodule per
softmax: `long_softmax` and `global_softmax` (SoftmaxParameters).

On CPU in float32 each softmax runs whole in compiled kernels (longdoc.model.kernels.cpu), forward and
backward, from the projections to the context (`CompiledSoftmax`): no key windows are copied, and
the scores and weights stay in cache but for what is carried or kept for the backward. The eager
path below (`_attend`: `PickRelative`, `masked_softmax`, `_window_keys`) is their specification
and serves every other device and dtype, and LONGDOC_KERNELS=0.

Shapes below: B batch, h heads, d head size, Lp padded long length (a multiple of b), nb = Lp / b,
W = 3b window keys, G global tokens, R relative vocabulary.
"""

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longdoc.model.config import GlobalLocalConfig
from longdoc.model.kernels import cpu as kernels
from longdoc.model.dropout import Dropout, keep_mask, kept_scale
from longdoc.model.linear import Linear
from longdoc.model.side_inputs import RelativeIdLayout, SideInputs


@dataclass
class AttentionCarry:
    """The raw scores one layer carries to the next under residual attention (RealFormer), per
    softmax, in the shapes they are computed in: long [B, h, nb, b, W + G], global [B, h, G, G + Lp]."""

    long_scores: Tensor | None = None
    global_scores: Tensor | None = None


class Workspace:
    """Big buffers handed from layer to layer within one forward pass, when nothing needs them kept.

    A fresh tensor of 40-100 MB costs more in page faults than the arithmetic done in it (at 4k
    tokens on CPU, a concatenation, an add or a softmax into a fresh tensor runs several times slower
    than into an existing one). Without autograd nothing a layer computes outlives the next layer, so
    each layer gives its big tensors back here and the next one takes them. With autograd
    (`reuse=False`) every tensor may be saved for backward: `take` gives None, which every op below
    reads as "allocate a fresh result" (`out=None`), so both modes run the same code.
    """

    def __init__(self, reuse: bool):
        self.reuse = reuse
        self._free: dict[tuple[str, str], Tensor] = {}

    def take(self, name: tuple[str, str], shape: tuple[int, ...], like: Tensor) -> Tensor | None:
        if not self.reuse:
            return None
        buffer = self._free.pop(name, None)
        if buffer is None or buffer.shape != shape or buffer.dtype != like.dtype or buffer.device != like.device:
            buffer = like.new_empty(shape)
        return buffer

    def give(self, name: tuple[str, str], buffer: Tensor | None) -> None:
        if self.reuse and buffer is not None:
            self._free[name] = buffer

    def spare(self, buffer: Tensor | None) -> Tensor | None:
        """`buffer` for an op to write its result into, if buffers are reused."""
        return buffer if self.reuse else None


class _MaskedSoftmax(torch.autograd.Function):
    """softmax(scale * scores + mask_bias) over the last dimension, in one tensor (`out`, or a fresh one).

    Autograd's own path would allocate the masked logits and the weights separately; this writes
    the masked logits straight into the tensor that becomes the weights (saved for backward).
    """

    @staticmethod
    def forward(ctx, scores: Tensor, mask_bias: Tensor, scale: float, out: Tensor | None) -> Tensor:
        probs = torch.add(mask_bias, scores, alpha=scale, out=out)
        torch.softmax(probs, -1, out=probs)
        ctx.scale = scale
        ctx.save_for_backward(probs)
        return probs

    @staticmethod
    def backward(ctx, grad_probs: Tensor):
        (probs,) = ctx.saved_tensors
        # No public op computes the softmax's backward from its output in one kernel; written out
        # with public ops, probs * (grad - (grad * probs).sum(-1, keepdim=True)) takes several times
        # as long.
        grad_scores = torch.ops.aten._softmax_backward_data(grad_probs, probs, -1, probs.dtype)
        if ctx.scale != 1.0:
            grad_scores = grad_scores * ctx.scale
        return grad_scores, None, None, None


def masked_softmax(scores: Tensor, mask_bias: Tensor, scale: float = 1.0, out: Tensor | None = None) -> Tensor:
    """softmax(scale * scores + mask_bias, dim=-1), written into `out` if given (only without autograd)."""
    return _MaskedSoftmax.apply(scores, mask_bias, scale, out)


class PickRelative(torch.autograd.Function):
    """picked[..., q, c] = relative[..., q, ids[..., q, c]]: each pair's relative term (a gather),
    with a backward that sums by the ids' structure instead of scattering pair by pair (a
    scatter-add over every [.., b, 3b + G] pair was training's largest non-matmul op at 4k tokens).

    relative [B, h, ..., Nq, R], ids [B, 1, ..., Nq, Nk]. The key columns are [head | long-global
    pairs]; a pair's id there is "linked" when the long token links to the global one (`links`
    [B, Lp, 2], side_inputs), else "unlinked", so their gradient is a sum per query over the row and
    over at most two linked entries. The long softmax (`block_size` b given) has queries [.., nb, b]
    and a head of 3b window keys whose ids depend only on the distance c - b - p
    (side_inputs.local_relative_ids): each unclipped id is one column per query, and the two clipped
    ids are a prefix and a suffix of the row, read from its running sum. The global softmax has G
    queries and a G x G head, whose gradient is a (small) scatter-add. `out`: a buffer for the
    picked terms (only without autograd).
    """

    @staticmethod
    def forward(ctx, relative: Tensor, ids: Tensor, links: Tensor | None, layout: RelativeIdLayout,
                block_size: int | None, out: Tensor | None):
        ctx.save_for_backward(ids, links)
        ctx.layout, ctx.block_size, ctx.relative_shape = layout, block_size, relative.shape
        return torch.gather(relative, -1, ids.expand(*relative.shape[:-1], ids.shape[-1]), out=out)

    @staticmethod
    def backward(ctx, grad_picked: Tensor):
        ids, links = ctx.saved_tensors
        grad = relative_gradient(grad_picked, ids, links, ctx.layout, ctx.block_size, ctx.relative_shape)
        return grad, None, None, None, None, None


@dataclass
class _KernelAttention:
    """What `CompiledSoftmax` needs besides its tensors: the settings of one softmax and its side inputs."""

    num_heads: int
    block_size: int  # b: the first keys are a window of 3b around each block of b queries; 0: all of them
    mask_bias: Tensor  # [B, 1, ..., Nq, N]
    relative_ids: Tensor | None  # int32 (SideInputs)
    links: Tensor | None
    layout: RelativeIdLayout | None
    scale: float  # of the summed scores in the softmax (the running mean's)
    keep_summed: bool  # residual attention: return the summed scores
    drop_probability: float  # attention dropout, applied to the weights that multiply the values
    key_ranges: Tensor | None = None  # [B, Nq, 2] int32: the second keys each query may see (SideInputs.global_key_ranges)
    # The caller's grad mode: autograd marks inputs that require grad in ctx.needs_input_grad under
    # no_grad and inference_mode too, so only this says whether a backward can follow.
    records_graph: bool = True


def _head_views(projected: Tensor, heads: int, parts: int = 3) -> tuple[Tensor, ...]:
    """[B, N, parts * H] -> `parts` views [B, h, N, d]: q, k, v (3) or k, v (2), rows at the input's stride."""
    return projected.unflatten(-1, (parts, heads, -1)).permute(2, 0, 3, 1, 4).unbind(0)


def _query_rows(tensor: Tensor | None, batch: int, num_queries: int) -> Tensor | None:
    """[B, h, ..., Nq, N] (blocked or not) -> [B, h, Nq, N], as the kernels read per-head tensors."""
    return None if tensor is None else tensor.view(batch, -1, num_queries, tensor.shape[-1])


def _key_value_views(projected: Tensor, own_qkv: Tensor, heads: int) -> tuple[Tensor, Tensor]:
    """Keys and values [B, h, N, d] of `projected`: a stream's fused projection [B, N, 3H] (its
    queries unused) or a cross projection [B, N, 2H]; `own_qkv` [B, Nq, 3H] gives H."""
    return _head_views(projected, heads, parts=3 * projected.shape[-1] // own_qkv.shape[-1])[-2:]


def _kernel_keys(own_qkv: Tensor, other: Tensor, attention: _KernelAttention) -> dict:
    """The queries and keys of one softmax, as every kernel takes them (views [B, h, N, d]): the
    queries of `own_qkv`, its keys and values first (with `window_block` b: the window of 3b keys
    around each block of b queries), then all of `other`'s keys and values."""
    query, first_keys, first_values = _head_views(own_qkv, attention.num_heads)
    second_keys, second_values = _key_value_views(other, own_qkv, attention.num_heads)
    return dict(query=query, query_scale=1.0 / math.sqrt(query.shape[-1]), first_keys=first_keys,
                first_values=first_values, window_block=attention.block_size, second_keys=second_keys,
                second_values=second_values)


class CompiledSoftmax(torch.autograd.Function):
    """One softmax from projections to context in the compiled kernels (CPU float32; see
    longdoc.model.kernels.cpu): the queries of `own_qkv` [B, Nq, 3H] over the first keys (its own) and
    the second keys (all of `other`'s: [B, N2, 3H], the other stream's fused projection, or [B, N2,
    2H], a cross projection); `relative` [B, h, ..., Nq, R] and `carried` scores as in
    `_attend`, the talking-heads mixes `pre`, `post` [h, h] (any may be None). Returns (context
    [B, Nq, H], summed scores or None).

    q, k and v are read where the projection wrote them, the context is written where the output
    projection reads it, and nothing score-sized is allocated but the carried sum, and when autograd
    records the call what the backward (compiled too) needs: the weights, dropout's mask, and with
    talking heads the summed scores. Without autograd the summed scores are written over the carried
    ones.
    """

    @staticmethod
    def forward(ctx, own_qkv: Tensor, other: Tensor, relative: Tensor | None, carried: Tensor | None,
                pre: Tensor | None, post: Tensor | None, attention: _KernelAttention):
        batch, num_queries, width = own_qkv.shape
        heads, talking = attention.num_heads, pre is not None
        for_backward = attention.records_graph and any(ctx.needs_input_grad[:6])
        # The kernel applies dropout to the weights it keeps: kept in train mode without autograd too.
        keeps_weights = for_backward or attention.drop_probability > 0
        scores_shape = torch.Size((batch, heads, *attention.mask_bias.shape[2:]))
        summed = None
        if attention.keep_summed or (for_backward and talking):  # (talking heads' backward reads them)
            summed = carried if carried is not None and not for_backward else own_qkv.new_empty(scores_shape)
        probs = own_qkv.new_empty(scores_shape) if keeps_weights else None
        keep, keep_scale = None, 1.0
        if attention.drop_probability > 0:
            keep, realised = keep_mask(scores_shape, attention.drop_probability)
            keep, keep_scale = keep.view(torch.uint8), kept_scale(realised)
        context = own_qkv.new_empty(batch, num_queries, heads, width // (3 * heads))
        # Per-head tensors as [B, h, Nq, N]; the ids and the mask, shared by the heads, as [B, Nq, N].
        rows = functools.partial(_query_rows, batch=batch, num_queries=num_queries)
        shared = lambda tensor: None if tensor is None else tensor.view(batch, num_queries, -1)
        arguments = dict(
            _kernel_keys(own_qkv, other, attention), relative=rows(relative), ids=shared(attention.relative_ids),
            carried=rows(carried), mask_bias=shared(attention.mask_bias), scale=attention.scale, keep=rows(keep),
            keep_scale=keep_scale, summed_out=rows(summed), probs_out=rows(probs), context_out=context.transpose(1, 2),
            key_ranges=attention.key_ranges,
        )
        if talking:
            kernels.compiled().talking_heads_forward(**arguments, pre=pre.contiguous(), post=post.contiguous())
        else:
            kernels.compiled().attention_forward(**arguments)
        if for_backward:
            ctx.save_for_backward(own_qkv, other, probs, keep, summed if talking else None, pre, post)
            ctx.attention, ctx.keep_scale = attention, keep_scale
            ctx.relative_shape = None if relative is None else relative.shape
        return context.view(batch, num_queries, -1), summed if attention.keep_summed else None

    @staticmethod
    def backward(ctx, grad_context: Tensor, grad_summed: Tensor | None):
        own_qkv, other, probs, keep, summed, pre, post = ctx.saved_tensors
        attention, heads = ctx.attention, ctx.attention.num_heads
        batch, num_queries, _ = own_qkv.shape
        grad_own, grad_other = torch.zeros_like(own_qkv), torch.zeros_like(other)
        grad_query, grad_first_keys, grad_first_values = _head_views(grad_own, heads)
        grad_second_keys, grad_second_values = _key_value_views(grad_other, own_qkv, heads)
        grad_scores = torch.empty_like(probs)
        rows = functools.partial(_query_rows, batch=batch, num_queries=num_queries)
        arguments = dict(
            _kernel_keys(own_qkv, other, attention), probs=rows(probs), keep=rows(keep),
            keep_scale=ctx.keep_scale,
            grad_context=grad_context.contiguous().view(batch, num_queries, heads, -1).transpose(1, 2),
            grad_summed=rows(None if grad_summed is None else grad_summed.contiguous()), scale=attention.scale,
            grad_scores_out=rows(grad_scores), grad_query=grad_query, grad_first_keys=grad_first_keys,
            grad_first_values=grad_first_values, grad_second_keys=grad_second_keys,
            grad_second_values=grad_second_values, key_ranges=attention.key_ranges,
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
            grad_relative = relative_gradient(grad_scores, attention.relative_ids, attention.links, attention.layout,
                                              attention.block_size or None, ctx.relative_shape)
        grad_carried = grad_scores if ctx.needs_input_grad[3] else None
        return grad_own, grad_other, grad_relative, grad_carried, grad_pre, grad_post, None


def relative_gradient(grad_picked: Tensor, ids: Tensor, links: Tensor | None, layout: RelativeIdLayout,
                      block_size: int | None, relative_shape: torch.Size) -> Tensor:
    """The gradient of the relative terms [B, h, ..., Nq, R] from that of the picked ones (PickRelative)."""
    grad = grad_picked.new_zeros(relative_shape)
    if block_size is None:  # global queries: [G globals | Lp long keys]
        head_width = relative_shape[-2]
        head, pairs = grad_picked[..., :head_width], grad_picked[..., head_width:]
        grad.scatter_add_(-1, ids[..., :head_width].expand(head.shape), head)
        linked_sum = None if links is None else _linked_sums_of_global_queries(pairs, links)
    else:  # long queries: [3b window keys | G globals]
        head, pairs = grad_picked[..., : 3 * block_size], grad_picked[..., 3 * block_size :]
        _add_window_gradient(head, block_size, layout, grad)
        linked_sum = None if links is None or pairs.shape[-1] == 0 else _linked_sums_of_long_queries(pairs, links)
    pair_sum = pairs.sum(-1)
    if linked_sum is None:
        grad[..., layout.unlinked] += pair_sum
    else:
        grad[..., layout.linked] += linked_sum
        grad[..., layout.unlinked] += pair_sum - linked_sum
    return grad


def _add_window_gradient(grad_window: Tensor, b: int, layout: RelativeIdLayout, grad: Tensor) -> None:
    """Add to grad [.., b, R] the gradient of the window's relative terms, grad_window [.., b, 3b]."""
    k, width = layout.max_distance, grad_window.shape[-1]
    device = grad_window.device
    query = torch.arange(b, device=device).view(-1, 1)
    # Unclipped distances -k < d < k: key column b + p + d of query p, one per (p, d) (or none).
    distances = torch.arange(-k + 1, k, device=device)
    columns = b + query + distances  # [b, 2k - 1]
    inside = (columns >= 0) & (columns < width)
    picked = torch.gather(grad_window, -1, columns.clamp(0, width - 1).expand(*grad_window.shape[:-1], -1))
    grad[..., layout.distance_ids(distances)] += picked * inside
    # Clipped: d <= -k is the prefix c <= b + p - k, d >= k the suffix c >= b + p + k.
    running = torch.cumsum(grad_window, -1)
    ends = torch.cat([b + query - k, b + query + k - 1], dim=1)  # [b, 2]: last column of the prefix, of the non-suffix
    at_ends = torch.gather(running, -1, ends.clamp(0, width - 1).expand(*grad_window.shape[:-1], -1))
    grad[..., layout.left_clipped] += at_ends[..., 0] * (ends[:, 0] >= 0)
    grad[..., layout.right_clipped] += running[..., -1] - torch.where(ends[:, 1] < width, at_ends[..., 1], running[..., -1])


def _linked_sums_of_long_queries(pairs: Tensor, links: Tensor) -> Tensor:
    """pairs [B, h, nb, b, G] (long query, global key), links [B, Lp, 2] -> [B, h, nb, b]: each
    query's sum over the global keys it links to."""
    batch, heads, nb, b, _ = pairs.shape
    links = links.view(batch, 1, nb, b, 2)
    picked = torch.gather(pairs, -1, links.clamp(min=0).expand(batch, heads, nb, b, 2))
    return (picked * (links >= 0)).sum(-1)


def _linked_sums_of_global_queries(pairs: Tensor, links: Tensor) -> Tensor:
    """pairs [B, h, G, Lp] (global query, long key), links [B, Lp, 2] -> [B, h, G]: each global
    query's sum over the long keys that link to it."""
    batch, heads, num_globals, _ = pairs.shape
    index = links.clamp(min=0).transpose(1, 2).unsqueeze(1).expand(batch, heads, 2, -1)  # [B, h, 2, Lp]
    picked = torch.gather(pairs, 2, index) * (links >= 0).transpose(1, 2).unsqueeze(1)  # pairs[.., link, l]
    return pairs.new_zeros(batch, heads, num_globals).scatter_add_(-1, index.flatten(2), picked.flatten(2))


class SoftmaxParameters(nn.Module):
    """The parameters of one of the two softmaxes (long queries, global queries) besides the
    projections: ETC's relative position terms, a key embedding `relative_key` E [R, h, d] and a
    bias `relative_bias` b [R, h] (None without relative positions), and the talking-heads mixes
    `talking_heads_pre` and `talking_heads_post` [h_out, h_in] on either side of the softmax (None
    without talking heads; identity at initialisation, so a fresh model attends plainly).

    `name` ("long" or "global") names the softmax's buffers in a Workspace.
    """

    def __init__(self, config: GlobalLocalConfig, name: str):
        super().__init__()
        self.name = name
        heads = config.num_attention_heads
        if config.uses_relative_positions:
            self.relative_key = nn.Parameter(torch.empty(config.relative_vocab_size, heads, config.head_size))
            self.relative_bias = nn.Parameter(torch.empty(config.relative_vocab_size, heads))
        else:
            self.relative_key = self.relative_bias = None
        if config.talking_heads:
            self.talking_heads_pre = nn.Parameter(torch.eye(heads))
            self.talking_heads_post = nn.Parameter(torch.eye(heads))
        else:
            self.talking_heads_pre = self.talking_heads_post = None


class GlobalLocalAttention(nn.Module):
    """Projections, the two softmaxes and the output projections for both streams."""

    def __init__(self, config: GlobalLocalConfig):
        super().__init__()
        hidden, heads = config.hidden_size, config.num_attention_heads
        self.num_heads = heads
        self.head_size = config.head_size
        self.residual_attention = config.residual_attention
        self.residual_attention_mean = config.residual_attention_mean
        self.dropout = Dropout(config.attention_probs_dropout_prob)

        # Q, K and V in one matmul per stream; the global stream may share the long one's weights.
        self.long_qkv = Linear(hidden, 3 * hidden)
        self.global_qkv = None if config.share_qkv else Linear(hidden, 3 * hidden)
        # Each token's keys and values come from its own stream's projection, for both softmaxes;
        # with cross_kv_projections (ETC's per-piece projections, l2g and g2l) the keys and values
        # a stream's queries read from the other stream have projections of their own.
        cross = config.cross_kv_projections
        self.long_queries_global_kv = Linear(hidden, 2 * hidden) if cross else None
        self.global_queries_long_kv = Linear(hidden, 2 * hidden) if cross else None
        self.long_output = Linear(hidden, hidden)
        self.global_output = None if config.share_attention_output else Linear(hidden, hidden)
        # One set of relative tables and head mixes per softmax (ETC).
        self.long_softmax = SoftmaxParameters(config, "long")
        self.global_softmax = SoftmaxParameters(config, "global")

        # Weights saved before the per-softmax submodules name these parameters otherwise.
        self.register_load_state_dict_pre_hook(_rename_legacy_parameters)

    def forward(
        self,
        long_hidden: Tensor,
        global_hidden: Tensor,
        side: SideInputs,
        carry: AttentionCarry | None,
        layer_number: int,
        workspace: Workspace | None = None,
    ) -> tuple[Tensor, Tensor, AttentionCarry]:
        """long_hidden [B, Lp, H], global_hidden [B, G, H] -> the attention outputs of both streams
        (after the output projections) and the scores to carry. `workspace`: where big buffers are
        reused from layer to layer (only without autograd); None: fresh tensors."""
        carry = carry or AttentionCarry()
        workspace = workspace or Workspace(reuse=False)
        batch, padded_length, _ = long_hidden.shape
        b, nb = side.block_size, side.num_blocks

        long_qkv = self.long_qkv(long_hidden)
        global_qkv = (self.global_qkv or self.long_qkv)(global_hidden)
        cross = None
        if self.long_queries_global_kv is not None:  # [B, G, 2H], [B, Lp, 2H]
            cross = self.long_queries_global_kv(global_hidden), self.global_queries_long_kv(long_hidden)
        if kernels.available_for(long_qkv):
            return self._forward_compiled(long_qkv, global_qkv, cross, side, carry, layer_number)
        long_q, long_k, long_v = self._split_heads(long_qkv)  # [B, h, Lp, d] each
        global_q, global_k, global_v = self._split_heads(global_qkv)
        # The other stream's keys and values, as each stream's queries read them.
        global_k_of_long, global_v_of_long, long_k_of_global, long_v_of_global = (
            (global_k, global_v, long_k, long_v) if cross is None
            else (*self._split_heads(cross[0], parts=2), *self._split_heads(cross[1], parts=2)))

        long_ids, global_ids = side.int64_relative_ids
        # Long queries, in blocks, over [previous | own | next block | all globals].
        window_k = self._window_keys(long_k, global_k_of_long, b, nb, workspace, ("long", "keys"))  # [B, h, nb, W + G, d]
        window_v = self._window_keys(long_v, global_v_of_long, b, nb, workspace, ("long", "values"))
        long_context, long_scores = self._attend(
            long_q.reshape(batch, self.num_heads, nb, b, self.head_size), window_k, window_v, self.long_softmax,
            side.long_mask_bias, long_ids, side, b, carry.long_scores, layer_number, workspace,
        )
        long_context = long_context.view(batch, self.num_heads, padded_length, self.head_size)
        long_out = self.long_output(self._merge_heads(long_context))
        workspace.give(("long", "keys"), window_k)
        workspace.give(("long", "values"), window_v)

        # Global queries over [all globals | all long tokens].
        if global_hidden.shape[1] == 0:
            return long_out, global_hidden, AttentionCarry(long_scores, None)
        all_k = self._concat(global_k, long_k_of_global, workspace, ("global", "keys"))  # [B, h, G + Lp, d]
        all_v = self._concat(global_v, long_v_of_global, workspace, ("global", "values"))
        global_context, global_scores = self._attend(
            global_q, all_k, all_v, self.global_softmax,
            side.global_mask_bias, global_ids, side, None, carry.global_scores, layer_number, workspace,
        )
        global_out = (self.global_output or self.long_output)(self._merge_heads(global_context))
        workspace.give(("global", "keys"), all_k)
        workspace.give(("global", "values"), all_v)
        return long_out, global_out, AttentionCarry(long_scores, global_scores)

    def _forward_compiled(
        self, long_qkv: Tensor, global_qkv: Tensor, cross: tuple[Tensor, Tensor] | None, side: SideInputs,
        carry: AttentionCarry, layer_number: int,
    ) -> tuple[Tensor, Tensor, AttentionCarry]:
        """`forward` on CPU in float32: each softmax whole, talking heads included, in one compiled
        kernel (`CompiledSoftmax`). `cross`: the cross projections' keys and values, as in `forward`."""
        # The kernels read keys and values where the projections wrote them: no copies.
        global_keys_of_long, long_keys_of_global = cross or (global_qkv, long_qkv)
        long_context, long_scores = self._attend_compiled(
            long_qkv, global_keys_of_long, side.block_size, self.long_softmax, side.long_mask_bias,
            side.long_relative_ids, side, carry.long_scores, layer_number, key_ranges=None,
        )
        long_out = self.long_output(long_context)
        if global_qkv.shape[1] == 0:
            no_globals = global_qkv.new_zeros(*global_qkv.shape[:2], long_out.shape[-1])
            return long_out, no_globals, AttentionCarry(long_scores)
        global_context, global_scores = self._attend_compiled(
            global_qkv, long_keys_of_global, 0, self.global_softmax, side.global_mask_bias,
            side.global_relative_ids, side, carry.global_scores, layer_number,
            key_ranges=side.global_key_ranges,
        )
        global_out = (self.global_output or self.long_output)(global_context)
        return long_out, global_out, AttentionCarry(long_scores, global_scores)

    def _attend_compiled(
        self,
        own_qkv: Tensor,
        other: Tensor,
        block_size: int,
        softmax: SoftmaxParameters,
        mask_bias: Tensor,
        relative_ids: Tensor | None,
        side: SideInputs,
        carried: Tensor | None,
        layer_number: int,
        key_ranges: Tensor | None,
    ) -> tuple[Tensor, Tensor | None]:
        """One softmax in the compiled kernel: the queries of `own_qkv` [B, Nq, 3H] over [its keys
        (with `block_size` b: the window of 3b around each block of b queries) | the keys of
        `other` [B, N2, 3H or 2H] (with `key_ranges`: those each query may see, the rest skipped)] -> (context
        [B, Nq, H], the summed scores to carry or None)."""
        relative = None
        if relative_ids is not None:
            query = _head_views(own_qkv, self.num_heads)[0]  # [B, h, Nq, d], unscaled: the kernel scales q.k
            blocked_query = query if block_size == 0 else query.unflatten(2, (-1, block_size))
            relative = self._relative_terms(blocked_query, softmax, 1.0 / math.sqrt(self.head_size))
        attention = _KernelAttention(
            self.num_heads, block_size, mask_bias, relative_ids, side.links, side.relative_layout,
            scale=1.0 / layer_number if self.residual_attention_mean else 1.0,
            keep_summed=self.residual_attention,
            drop_probability=self.dropout.p if self.training else 0.0,
            key_ranges=key_ranges,
            records_graph=torch.is_grad_enabled(),
        )
        return CompiledSoftmax.apply(own_qkv, other, relative, carried, softmax.talking_heads_pre,
                                     softmax.talking_heads_post, attention)

    def _attend(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        softmax: SoftmaxParameters,
        mask_bias: Tensor,
        relative_ids: Tensor | None,
        side: SideInputs,
        block_size: int | None,
        carried: Tensor | None,
        layer_number: int,
        workspace: Workspace,
    ) -> tuple[Tensor, Tensor | None]:
        """One softmax: query [..., Nq, d], key and value [..., Nk, d] -> (context [..., Nq, d],
        the scores to carry or None). `block_size`: b for the blocked long queries, None for the
        global ones.

        With autograd every big tensor is fresh (the weights are saved for backward). With buffers
        reused, two score-sized buffers serve all layers: the carried sum, and one that holds this
        layer's raw scores and then its weights.
        """
        scale = 1.0 / layer_number if self.residual_attention_mean else 1.0
        shape = (*query.shape[:-1], key.shape[-2])
        # matmul, not bmm(...).view(...): its result is no autograd view, so the in-place adds
        # below stay cheap in backward (an in-place op on a view costs copies).
        scores = torch.matmul(query, key.transpose(-1, -2), out=workspace.take((softmax.name, "scores"), shape, query))
        relative = None if relative_ids is None else self._relative_terms(query, softmax)
        # The buffer free once the softmax's input is formed: the carried sum these scores replace,
        # or the scores themselves when nothing is carried on (the softmax then works in place).
        spent = carried if self.residual_attention else scores
        if relative is not None:
            buffer = workspace.take((softmax.name, "relative"), shape, query)
            picked = PickRelative.apply(relative, relative_ids, side.links, side.relative_layout, block_size, buffer)
            # A plain matmul then an add: measured faster than baddbmm_ accumulating into the picked
            # terms (beta = 1 slows MKL's small batched gemms more than the extra pass costs).
            scores.add_(picked)
            workspace.give((softmax.name, "relative"), picked)
        if carried is not None:
            scores = scores.add_(carried)  # in place is safe for autograd: no backward needs these values
        probs = self._probabilities(scores, mask_bias, scale, softmax, out=workspace.spare(spent))
        context = torch.matmul(probs, value)
        workspace.give((softmax.name, "scores"), probs)
        return context, scores if self.residual_attention else None

    def _split_heads(self, projected: Tensor, parts: int = 3) -> tuple[Tensor, ...]:
        """[B, N, 3H] -> three contiguous [B, h, N, d], the query pre-scaled by 1/sqrt(d); [B, N, 2H]
        (`parts` = 2) -> key and value."""
        # One copy into head-major layout, so that every later reshape of q, k, v is a view.
        pieces = torch.stack(_head_views(projected, self.num_heads, parts)).unbind(0)
        if parts == 2:
            return pieces
        query, key, value = pieces
        return query * (1.0 / math.sqrt(self.head_size)), key, value

    def _merge_heads(self, context: Tensor) -> Tensor:
        """[B, h, N, d] -> [B, N, H]."""
        batch, _, length, _ = context.shape
        return context.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_size)

    @staticmethod
    def _window_keys(
        long_k: Tensor, global_k: Tensor, b: int, nb: int, workspace: Workspace, name: tuple[str, str]
    ) -> Tensor:
        """Keys of each query block: previous, own and next long block, then all globals.

        long_k [B, h, nb * b, d], global_k [B, h, G, d] -> [B, h, nb, 3b + G, d]. One copy of the
        keys (3 + G / b times their size), small next to the [.., b, 3b + G] scores it enables as a
        single batched matmul. The windows are an overlapping view (unfold), whose backward sums
        the three overlaps in one kernel.
        """
        batch, heads, _, size = long_k.shape
        windows = F.pad(long_k, (0, 0, b, b)).unfold(2, 3 * b, b).transpose(-1, -2)  # [B, h, nb, 3b, d] view
        pieces = [windows]
        if global_k.shape[2] > 0:
            pieces.append(global_k.unsqueeze(2).expand(batch, heads, nb, global_k.shape[2], size))
        shape = (batch, heads, nb, 3 * b + global_k.shape[2], size)
        return torch.cat(pieces, dim=3, out=workspace.take(name, shape, long_k))

    @staticmethod
    def _concat(first: Tensor, second: Tensor, workspace: Workspace, name: tuple[str, str]) -> Tensor:
        """[B, h, N1, d] and [B, h, N2, d] -> [B, h, N1 + N2, d]."""
        shape = (*first.shape[:2], first.shape[2] + second.shape[2], first.shape[3])
        return torch.cat([first, second], dim=2, out=workspace.take(name, shape, first))

    def _relative_terms(self, query: Tensor, softmax: SoftmaxParameters, query_scale: float = 1.0) -> Tensor:
        """ETC's relative terms (q.E[id] + b[id]) / sqrt(d) for all R ids at once (small; each pair
        picks its own): query [B, h, ..., Nq, d] (pre-scaled, unless `query_scale` scales it) -> [B, h, ..., Nq, R]."""
        table, bias = softmax.relative_key, softmax.relative_bias  # [R, h, d], [R, h]
        batch, heads, size = query.shape[0], query.shape[1], query.shape[-1]
        keys = table.permute(1, 2, 0)  # [h, d, R]
        if query_scale != 1.0:
            keys = keys * query_scale  # (the small side, not the [.., Nq, R] result)
        relative = torch.matmul(query.reshape(batch, heads, -1, size), keys)  # [B, h, N, R]
        return (relative + (bias.t() / math.sqrt(self.head_size)).unsqueeze(1)).view(*query.shape[:-1], bias.shape[0])

    def _probabilities(
        self, scores: Tensor, mask_bias: Tensor, scale: float, softmax: SoftmaxParameters, out: Tensor | None
    ) -> Tensor:
        """Carried scores -> attention weights: (running mean's `scale`) -> talking heads -> mask ->
        softmax. `out`: a free buffer for the weights (only without autograd)."""
        if softmax.talking_heads_pre is None:
            return self.dropout(masked_softmax(scores, mask_bias, scale, out=out))
        # The running mean's scale commutes with the (linear) head mix, so the softmax applies it:
        # no extra pass over the scores. A free buffer takes the mixed logits, unless it is the
        # scores themselves (the mix cannot write over its input).
        logits = self._mix_heads(scores, softmax.talking_heads_pre, out=None if out is scores else out)
        probs = masked_softmax(logits, mask_bias, scale, out=None if out is None else logits)
        return self.dropout(self._mix_heads(probs, softmax.talking_heads_post))

    @staticmethod
    def _mix_heads(values: Tensor, mixing: Tensor, out: Tensor | None = None) -> Tensor:
        """Mix [B, h, ...] across heads with mixing [h_out, h_in]: one batched matmul over the
        flattened pairs. bmm with the mixing expanded over the batch, not matmul(2-D, 3-D): that
        one computes (values^T mixing^T)^T and copies its [pairs, h] result back across the heads'
        stride, which costs more than the matmul itself."""
        batch, heads = values.shape[:2]
        mixing = mixing.expand(batch, *mixing.shape)
        flat_out = None if out is None else out.view(batch, heads, -1)
        return torch.bmm(mixing, values.reshape(batch, heads, -1), out=flat_out).view(values.shape)


# The per-softmax parameters' names, relative to an attention module, in weights saved before
# SoftmaxParameters (lifted and trained models up to November 2026) -> their names now.
LEGACY_PARAMETER_NAMES = {
    f"{softmax}_{parameter}": f"{softmax}_softmax.{parameter}"
    for softmax in ("long", "global")
    for parameter in ("relative_key", "relative_bias", "talking_heads_pre", "talking_heads_post")
}


def _rename_legacy_parameters(module: nn.Module, state_dict: dict, prefix: str, *args) -> None:
    """Load hook of GlobalLocalAttention (every `load_state_dict`): old names under `prefix` -> current ones."""
    for old, new in LEGACY_PARAMETER_NAMES.items():
        if prefix + old in state_dict:
            state_dict[prefix + new] = state_dict.pop(prefix + old)
