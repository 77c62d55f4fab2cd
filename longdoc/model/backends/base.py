"""What every attention backend takes and gives: one softmax of global-local attention.

A layer (longdoc.model.attention) computes two softmaxes: the long queries' over [their window of
long keys | all global keys] and the global queries' over [all global keys | all long keys]. Each is
one call `backend.attend(SoftmaxOperands) -> SoftmaxResult`, from the projections to the context.

Shapes: B batch, h heads, d head size, H = h d; Nq queries; N1 first keys (the querying stream's
own), N2 second keys (the other stream's); R relative ids. The long softmax is blocked: its Nq = Lp =
nb b queries in nb blocks of b (`window_block` = b), each block over the 3b first keys around it
(previous, own and next block; beyond the ends: zero keys, always masked), so its scores are
[B, h, nb, b, 3b + N2]. The global softmax is not (`window_block` = 0): [B, h, Nq, N1 + N2]. "The
scores' shape" below is the one that applies; `mask_bias` has it with 1 for h.
"""

import math
from dataclasses import dataclass
from typing import Callable, ClassVar

import torch
from torch import Tensor

from longdoc.model.side_inputs import RelativeIdLayout


def head_views(projected: Tensor, heads: int, parts: int = 3) -> tuple[Tensor, ...]:
    """[B, N, parts * H] -> `parts` views [B, h, N, d]: q, k, v (3) or k, v (2), rows at the input's stride."""
    return projected.unflatten(-1, (parts, heads, -1)).permute(2, 0, 3, 1, 4).unbind(0)


def projection_heads(own: Tensor, other: Tensor, heads: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Views [B, h, N, d] where the projections wrote them: the query, first keys and first values of
    `own` [B, Nq, 3H]; the second keys and values of `other` ([B, N2, 3H], a fused projection whose
    queries go unused, or [B, N2, 2H], a cross projection)."""
    query, first_keys, first_values = head_views(own, heads)
    second_keys, second_values = head_views(other, heads, parts=3 * other.shape[-1] // own.shape[-1])[-2:]
    return query, first_keys, first_values, second_keys, second_values


@dataclass(frozen=True)
class SoftmaxOperands:
    """One softmax, as every backend takes it.

    own: [B, Nq, 3H], the querying stream's fused projection: its queries, and its keys and values (the
      first keys).
    other: [B, N2, 3H], the other stream's fused projection (its queries unused), or [B, N2, 2H], a
      cross projection (keys, values): the second keys and values.
    window_block: b > 0: the queries are blocks of b, each over the window of 3b first keys around it;
      0: every query over all first keys.
    mask_bias: the scores' shape with 1 head, the compute dtype: 0 where a query may attend, a large
      negative value elsewhere (longdoc.model.side_inputs).
    relative_ids: int64, mask_bias's shape: each pair's relative position id; relative_key E [R, h, d]
      and relative_bias b [R, h]: the softmax's tables, each pair adding (q.E[id] + b[id]) / sqrt(d);
      relative_layout and links ([B, Lp, 2], the global tokens each long token links to): the ids'
      structure, which the tables' gradient uses. All None without relative positions.
    carried: the scores' shape: the previous layer's summed scores (residual attention), or None.
    talking_heads_pre, talking_heads_post: [h, h] head mixes before and after the softmax, or None.
    scale: multiplies the summed scores in the softmax (1 / the layer's number under the running mean).
    drop_probability: attention dropout on the weights that multiply the values (0 outside training).
    keep_summed: return the summed scores (residual attention carries them to the next layer).
    keep_weights: return the attention weights (for inspection; nothing in a forward pass needs them),
      and leave `carried` as it was: the reader of the weights compares it with the summed scores.
    """

    own: Tensor
    other: Tensor
    num_heads: int
    window_block: int
    mask_bias: Tensor
    relative_ids: Tensor | None = None
    relative_key: Tensor | None = None
    relative_bias: Tensor | None = None
    relative_layout: RelativeIdLayout | None = None
    links: Tensor | None = None
    carried: Tensor | None = None
    talking_heads_pre: Tensor | None = None
    talking_heads_post: Tensor | None = None
    scale: float = 1.0
    drop_probability: float = 0.0
    keep_summed: bool = False
    keep_weights: bool = False

    @property
    def head_size(self) -> int:
        return self.own.shape[-1] // (3 * self.num_heads)

    @property
    def query_scale(self) -> float:
        """1 / sqrt(d), the scale of q.k in the scores."""
        return 1.0 / math.sqrt(self.head_size)

    @property
    def scores_shape(self) -> torch.Size:
        return torch.Size((self.mask_bias.shape[0], self.num_heads, *self.mask_bias.shape[2:]))

    def heads(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Views [B, h, N, d] where the projections wrote them: query, first keys, first values, second
        keys, second values."""
        return projection_heads(self.own, self.other, self.num_heads)

    def relative_terms_by_id(self) -> Tensor | None:
        """For kernels that pick each pair's relative term themselves: the terms of all R ids for every
        query, [B, h, ..., Nq, R] (blocked like the scores), from the unscaled queries (the kernels
        scale q.k); None without relative positions."""
        if self.relative_ids is None:
            return None
        query = self.heads()[0]  # [B, h, Nq, d]
        blocked = query if self.window_block == 0 else query.unflatten(2, (-1, self.window_block))
        return relative_terms(blocked, self.relative_key, self.relative_bias, self.query_scale)


@dataclass(frozen=True)
class SoftmaxResult:
    """context [B, Nq, H] (heads merged, as the output projection reads it); summed: the summed scores
    (the scores' shape) if `keep_summed`, else None; weights: the softmax's weights (the scores' shape;
    with talking heads before the post mix, without dropout; every query's row sums to 1 over the
    keys it may attend to) if `keep_weights`, else None."""

    context: Tensor
    summed: Tensor | None = None
    weights: Tensor | None = None


@dataclass(frozen=True)
class KernelSettings:
    """What the compiled backends' softmaxes (cpu: compiled_softmax, gpu: TritonSoftmax) take
    besides their tensors: the settings and side inputs of one softmax (SoftmaxOperands' fields of
    the same names) and what a backend derives for its kernel."""

    num_heads: int
    window_block: int
    mask_bias: Tensor
    relative_ids: Tensor | None  # int64 (the gradient's index type)
    kernel_ids: Tensor | None  # the same, int32 (the kernels')
    links: Tensor | None
    layout: RelativeIdLayout | None
    scale: float
    keep_summed: bool
    keep_weights: bool
    drop_probability: float
    key_ranges: Tensor | None  # [B, Nq, 2] int32: the second keys each query may see (cpu only)
    # The caller's grad mode: autograd marks inputs that require grad in ctx.needs_input_grad under
    # no_grad and inference_mode too, so only this says whether a backward can follow.
    records_graph: bool

    @classmethod
    def of(cls, operands: SoftmaxOperands, kernel_ids: Tensor | None,
           key_ranges: Tensor | None = None) -> "KernelSettings":
        """The settings of `operands`, read in the caller's grad mode."""
        o = operands
        return cls(o.num_heads, o.window_block, o.mask_bias, o.relative_ids, kernel_ids, o.links, o.relative_layout,
                   o.scale, o.keep_summed, o.keep_weights, o.drop_probability, key_ranges,
                   records_graph=torch.is_grad_enabled())


class AttentionBackend:
    """One way to compute the softmaxes. `refusal` says where it cannot run; an instance serves one
    forward pass (what it derives once from the side inputs, and buffers it hands from layer to
    layer, live that long). `reuse_buffers`: no autograd records the pass, so a layer's big tensors
    may be written over by the next; `keep_weights`: the layers ask for the weights."""

    name: ClassVar[str]

    @classmethod
    def refusal(cls, device: torch.device, dtype: torch.dtype) -> str | None:
        """Why this backend cannot run on `device` in `dtype` (None: it can)."""
        return None

    def __init__(self, reuse_buffers: bool = False, keep_weights: bool = False):
        self.reuse_buffers = reuse_buffers
        self.keep_weights = keep_weights
        self._derived: dict[tuple[int, str], tuple[Tensor, object]] = {}

    def derived(self, tensor: Tensor | None, what: str, derive: Callable[[Tensor], object]):
        """derive(tensor) (None for None), computed once per forward pass: the side inputs are the same
        tensors in every layer. `what` names the derivation."""
        if tensor is None:
            return None
        key = (id(tensor), what)
        if key not in self._derived or self._derived[key][0] is not tensor:
            self._derived[key] = (tensor, derive(tensor))
        return self._derived[key][1]

    def attend(self, operands: SoftmaxOperands) -> SoftmaxResult:
        raise NotImplementedError


def merge_heads(context: Tensor) -> Tensor:
    """[B, h, N, d] -> [B, N, H]."""
    batch, heads, length, size = context.shape
    return context.transpose(1, 2).reshape(batch, length, heads * size)


def relative_terms(query: Tensor, table: Tensor, bias: Tensor, query_scale: float = 1.0) -> Tensor:
    """ETC's relative terms (q.E[id] + b[id]) / sqrt(d) for all R ids at once (small; each pair picks
    its own): query [B, h, ..., Nq, d] (pre-scaled by 1 / sqrt(d), unless `query_scale` scales it),
    E [R, h, d], b [R, h] -> [B, h, ..., Nq, R]."""
    batch, heads, size = query.shape[0], query.shape[1], query.shape[-1]
    keys = table.permute(1, 2, 0)  # [h, d, R]
    if query_scale != 1.0:
        keys = keys * query_scale  # (the small side, not the [.., Nq, R] result)
    relative = torch.matmul(query.reshape(batch, heads, -1, size), keys)  # [B, h, N, R]
    return (relative + (bias.t() / math.sqrt(size)).unsqueeze(1)).view(*query.shape[:-1], bias.shape[0])
