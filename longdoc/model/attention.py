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
each piece is one batched matmul. Scores carried between layers keep these blocked shapes.

Shapes below: B batch, h heads, d head size, Lp padded long length (a multiple of b), nb = Lp / b,
W = 3b window keys, G global tokens, R relative vocabulary.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longdoc.cpu_memory import configure_allocator
from longdoc.model.config import GlobalLocalConfig
from longdoc.model.dropout import Dropout
from longdoc.model.side_inputs import RelativeIdLayout, SideInputs

# Training at 4k tokens is 2x slower when freed 40-100 MB tensors go back to the kernel; every
# process that builds the model keeps them instead (opt out: LONGDOC_ALLOCATOR=system).
configure_allocator()


@dataclass
class AttentionCarry:
    """The raw scores one layer carries to the next under residual attention (RealFormer), per
    softmax, in the shapes they are computed in: long [B, h, nb, b, W + G], global [B, h, G, G + Lp]."""

    long_scores: Tensor | None = None
    global_scores: Tensor | None = None


class Workspace:
    """Big buffers handed from layer to layer within one forward pass without autograd.

    A fresh tensor of 40-100 MB costs more in page faults than the arithmetic done in it (measured
    at 4k tokens on CPU: a concatenation into a fresh tensor 25x slower than into an existing one,
    an add or a softmax 3-4x). Without autograd nothing a layer computes outlives the next layer, so
    each layer gives its big tensors back here and the next one takes them.
    """

    def __init__(self):
        self._free: dict[str, Tensor] = {}

    def take(self, name: str, shape: tuple[int, ...], like: Tensor) -> Tensor:
        buffer = self._free.pop(name, None)
        if buffer is None or buffer.shape != shape or buffer.dtype != like.dtype or buffer.device != like.device:
            buffer = like.new_empty(shape)
        return buffer

    def give(self, name: str, buffer: Tensor) -> None:
        self._free[name] = buffer


class _MaskedSoftmax(torch.autograd.Function):
    """softmax(scale * scores + mask_bias) over the last dimension, in one fresh tensor.

    Autograd's own path would allocate the masked logits and the weights separately; this writes
    the masked logits straight into the tensor that becomes the weights (saved for backward).
    """

    @staticmethod
    def forward(ctx, scores: Tensor, mask_bias: Tensor, scale: float) -> Tensor:
        probs = torch.add(mask_bias, scores, alpha=scale) if scale != 1.0 else torch.add(scores, mask_bias)
        torch.ops.aten._softmax.out(probs, -1, False, out=probs)
        ctx.scale = scale
        ctx.save_for_backward(probs)
        return probs

    @staticmethod
    def backward(ctx, grad_probs: Tensor):
        (probs,) = ctx.saved_tensors
        grad_scores = torch.ops.aten._softmax_backward_data(grad_probs, probs, -1, probs.dtype)
        if ctx.scale != 1.0:
            grad_scores = grad_scores * ctx.scale
        return grad_scores, None, None


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
    queries and a G x G head, whose gradient is a (small) scatter-add.
    """

    @staticmethod
    def forward(ctx, relative: Tensor, ids: Tensor, links: Tensor | None, layout: RelativeIdLayout, block_size: int | None):
        ctx.save_for_backward(ids, links)
        ctx.layout, ctx.block_size, ctx.relative_shape = layout, block_size, relative.shape
        return torch.gather(relative, -1, ids.expand(*relative.shape[:-1], ids.shape[-1]))

    @staticmethod
    def backward(ctx, grad_picked: Tensor):
        ids, links = ctx.saved_tensors
        layout, block_size = ctx.layout, ctx.block_size
        grad = grad_picked.new_zeros(ctx.relative_shape)
        if block_size is None:  # global queries: [G globals | Lp long keys]
            head_width = ctx.relative_shape[-2]
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
        return grad, None, None, None, None


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


def masked_softmax(scores: Tensor, mask_bias: Tensor, scale: float = 1.0, out: Tensor | None = None) -> Tensor:
    """softmax(scale * scores + mask_bias, dim=-1); without autograd, written into `out` if given."""
    if torch.is_grad_enabled() and scores.requires_grad:
        return _MaskedSoftmax.apply(scores, mask_bias, scale)
    if out is None:
        out = torch.empty_like(scores)
    torch.add(mask_bias, scores, alpha=scale, out=out)
    return torch.ops.aten._softmax.out(out, -1, False, out=out)


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
        self.long_qkv = nn.Linear(hidden, 3 * hidden)
        self.global_qkv = None if config.share_qkv else nn.Linear(hidden, 3 * hidden)
        self.long_output = nn.Linear(hidden, hidden)
        self.global_output = None if config.share_attention_output else nn.Linear(hidden, hidden)

        if config.uses_relative_positions:
            # One table per softmax (ETC): a key embedding E [R, h, d] and a bias b [R, h].
            size = config.relative_vocab_size
            self.long_relative_key = nn.Parameter(torch.empty(size, heads, self.head_size))
            self.long_relative_bias = nn.Parameter(torch.empty(size, heads))
            self.global_relative_key = nn.Parameter(torch.empty(size, heads, self.head_size))
            self.global_relative_bias = nn.Parameter(torch.empty(size, heads))

        if config.talking_heads:
            # Mixing matrices [h_out, h_in], identity at initialisation: a fresh model attends plainly.
            for name in ("long_talking_heads_pre", "long_talking_heads_post",
                         "global_talking_heads_pre", "global_talking_heads_post"):
                setattr(self, name, nn.Parameter(torch.eye(heads)))
        self.talking_heads = config.talking_heads

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
        (after the output projections) and the scores to carry. `workspace`: reuse big buffers
        (only without autograd)."""
        carry = carry or AttentionCarry()
        batch, padded_length, _ = long_hidden.shape
        b, nb = side.block_size, side.num_blocks

        long_q, long_k, long_v = self._split_heads(self.long_qkv(long_hidden))  # [B, h, Lp, d] each
        global_q, global_k, global_v = self._split_heads((self.global_qkv or self.long_qkv)(global_hidden))

        # Long queries, in blocks, over [previous | own | next block | all globals].
        window_k = self._window_keys(long_k, global_k, b, nb, workspace, "long_keys")  # [B, h, nb, W + G, d]
        window_v = self._window_keys(long_v, global_v, b, nb, workspace, "long_values")
        long_context, long_scores = self._attend(
            long_q.reshape(batch, self.num_heads, nb, b, self.head_size), window_k, window_v,
            side, "long", carry.long_scores, layer_number, workspace,
        )
        long_context = long_context.view(batch, self.num_heads, padded_length, self.head_size)
        long_out = self.long_output(self._merge_heads(long_context))

        # Global queries over [all globals | all long tokens].
        global_scores = None
        if global_hidden.shape[1] > 0:
            all_k = self._concat(global_k, long_k, workspace, "global_keys")  # [B, h, G + Lp, d]
            all_v = self._concat(global_v, long_v, workspace, "global_values")
            global_context, global_scores = self._attend(
                global_q, all_k, all_v, side, "global", carry.global_scores, layer_number, workspace,
            )
            global_out = (self.global_output or self.long_output)(self._merge_heads(global_context))
        else:
            global_out = global_hidden
        if workspace is not None:
            workspace.give("long_keys", window_k)
            workspace.give("long_values", window_v)
            if global_hidden.shape[1] > 0:
                workspace.give("global_keys", all_k)
                workspace.give("global_values", all_v)
        return long_out, global_out, AttentionCarry(long_scores, global_scores)

    def _attend(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        side: SideInputs,
        softmax: str,
        carried: Tensor | None,
        layer_number: int,
        workspace: Workspace | None,
    ) -> tuple[Tensor, Tensor | None]:
        """One softmax: query [..., Nq, d], key and value [..., Nk, d] -> (context [..., Nq, d],
        the scores to carry or None).

        With autograd every big tensor is fresh (the weights are saved for backward). With a
        workspace two score-sized buffers serve all layers: the carried sum, and one that holds
        this layer's raw scores and then its weights.
        """
        raw = self._scores(query, key, side, softmax, workspace)
        if carried is None:
            scores, free = raw, (None if self.residual_attention else raw)
        elif workspace is not None:  # the carried buffer takes the sum; the raw one is free for the weights
            scores, free = carried.add_(raw), raw
        else:  # in place is safe for autograd: no backward needs these values
            scores, free = raw.add_(carried), None
        mask_bias = side.long_mask_bias if softmax == "long" else side.global_mask_bias
        probs = self._probabilities(scores, mask_bias, layer_number, softmax, out=free)
        context = torch.matmul(probs, value)
        if workspace is not None:
            workspace.give(f"{softmax}_scores", probs)
        return context, scores if self.residual_attention else None

    def _split_heads(self, qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """[B, N, 3H] -> three [B, h, N, d]; the query is pre-scaled by 1/sqrt(d)."""
        batch, length, _ = qkv.shape
        # One copy into head-major layout, so that every later reshape of q, k, v is a view.
        qkv = qkv.view(batch, length, 3, self.num_heads, self.head_size).permute(2, 0, 3, 1, 4).contiguous()
        query, key, value = qkv.unbind(0)
        return query * (1.0 / math.sqrt(self.head_size)), key, value

    def _merge_heads(self, context: Tensor) -> Tensor:
        """[B, h, N, d] -> [B, N, H]."""
        batch, _, length, _ = context.shape
        return context.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_size)

    @staticmethod
    def _window_keys(
        long_k: Tensor, global_k: Tensor, b: int, nb: int, workspace: Workspace | None, name: str
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
        if workspace is None:
            return torch.cat(pieces, dim=3)
        shape = (batch, heads, nb, 3 * b + global_k.shape[2], size)
        return torch.cat(pieces, dim=3, out=workspace.take(name, shape, long_k))

    @staticmethod
    def _concat(first: Tensor, second: Tensor, workspace: Workspace | None, name: str) -> Tensor:
        """[B, h, N1, d] and [B, h, N2, d] -> [B, h, N1 + N2, d]."""
        if workspace is None:
            return torch.cat([first, second], dim=2)
        shape = (*first.shape[:2], first.shape[2] + second.shape[2], first.shape[3])
        return torch.cat([first, second], dim=2, out=workspace.take(name, shape, first))

    def _scores(self, query: Tensor, key: Tensor, side: SideInputs, softmax: str, workspace: Workspace | None) -> Tensor:
        """Raw scores q.k/sqrt(d) (+ relative terms q.E[id] + b[id], over sqrt(d)).

        query [B, h, ..., Nq, d] (pre-scaled), key [B, h, ..., Nk, d] -> [B, h, ..., Nq, Nk].
        """
        shape = (*query.shape[:-1], key.shape[-2])
        if workspace is None:
            # matmul, not bmm(...).view(...): its result is no autograd view, so the in-place adds
            # below and in `_attend` stay cheap in backward (an in-place op on a view costs copies).
            scores = torch.matmul(query, key.transpose(-1, -2))
        else:
            scores = workspace.take(f"{softmax}_scores", shape, query)
            torch.matmul(query, key.transpose(-1, -2), out=scores)
        relative_ids = side.long_relative_ids if softmax == "long" else side.global_relative_ids
        if relative_ids is None:
            return scores
        # q.E[id] + b[id] for all R ids at once ([B, h, ..., Nq, R], small), then picked per pair.
        table = getattr(self, f"{softmax}_relative_key")  # [R, h, d]
        bias = getattr(self, f"{softmax}_relative_bias")  # [R, h]
        batch, heads, size = query.shape[0], query.shape[1], query.shape[-1]
        relative = torch.matmul(query.reshape(batch, heads, -1, size), table.permute(1, 2, 0))  # [B, h, N, R]
        relative = (relative + (bias.t() / math.sqrt(self.head_size)).unsqueeze(1)).view(
            *query.shape[:-1], bias.shape[0]
        )  # [B, h, ..., Nq, R]
        if workspace is not None:
            buffer = workspace.take(f"{softmax}_relative", shape, query)
            picked = torch.gather(relative, -1, relative_ids.expand(shape), out=buffer)
            workspace.give(f"{softmax}_relative", picked)
        else:
            block_size = side.block_size if softmax == "long" else None
            picked = PickRelative.apply(relative, relative_ids, side.links, side.relative_layout, block_size)
        # A plain matmul then an add: measured 1.5x faster than baddbmm_ accumulating into the
        # picked terms (beta = 1 slows MKL's small batched gemms more than the extra pass costs).
        return scores.add_(picked)

    def _probabilities(
        self, scores: Tensor, mask_bias: Tensor, layer_number: int, softmax: str, out: Tensor | None
    ) -> Tensor:
        """Carried scores -> attention weights: (running mean) -> talking heads -> mask -> softmax.
        `out`: a free buffer for the weights (only without autograd)."""
        scale = 1.0 / layer_number if self.residual_attention_mean else 1.0
        if self.talking_heads:
            # The running mean's scale commutes with the (linear) head mix, so the softmax applies it:
            # no extra pass over the scores. Without autograd the free buffer takes the mixed logits.
            if out is scores or (torch.is_grad_enabled() and scores.requires_grad):
                out = None  # the mix cannot write over its input; autograd keeps its inputs
            logits = self._mix_heads(scores, getattr(self, f"{softmax}_talking_heads_pre"), out=out)
            probs = masked_softmax(logits, mask_bias, scale, out=logits if out is not None else None)
            probs = self._mix_heads(probs, getattr(self, f"{softmax}_talking_heads_post"))
        else:
            probs = masked_softmax(scores, mask_bias, scale, out=out)
        return self.dropout(probs)

    @staticmethod
    def _mix_heads(values: Tensor, mixing: Tensor, out: Tensor | None = None) -> Tensor:
        """Mix [B, h, ...] across heads with mixing [h_out, h_in]: one batched matmul over the
        flattened pairs. bmm with the mixing expanded over the batch, not matmul(2-D, 3-D): that
        one computes (values^T mixing^T)^T and copies its [pairs, h] result back across the heads'
        stride, which took 3-4x the matmul itself at 4096 tokens."""
        batch, heads = values.shape[:2]
        mixing = mixing.expand(batch, *mixing.shape)
        if out is not None:
            torch.bmm(mixing, values.reshape(batch, heads, -1), out=out.view(batch, heads, -1))
            return out
        return torch.bmm(mixing, values.reshape(batch, heads, -1)).view(values.shape)
