"""Global-local attention: ETC's four pieces as two softmaxes, blocked, with residual scores.

References:
- ETC (Ainslie et al., 2020, arXiv:2004.08483): a long query attends over its local window (l2l)
  and all global tokens (l2g) in one softmax; a global query over all global (g2g) and all long
  tokens (g2l) in another. Relative positions: score = (q.k + q.E[id] + b[id]) / sqrt(d).
- RealFormer (He et al., 2020, arXiv:2012.11747): each layer adds the previous layer's raw
  (unmasked, pre-softmax) scores to its own; the mask is applied to a copy for the softmax.
- Talking-Heads Attention (Shazeer et al., 2020, arXiv:2003.02436): learned h x h mixing of the
  logits across heads before the softmax and of the weights after it.

The long softmax is computed in blocks of b queries (b = r + 1, or the input's length when it is
shorter; longdoc.model.side_inputs): a query block sees its previous, own and next key blocks (3b
keys, trimmed to the exact window by the mask) plus the G global keys, so scores are [B, h, nb, b,
3b + G] and memory is linear in the length. Scores carried between layers keep these blocked
shapes. The parameters each softmax has of its own (relative tables, talking-heads mixes) are a
submodule per softmax: `long_softmax` and `global_softmax` (SoftmaxParameters).

This module is the layer: projections, the two softmaxes' operands, output projections. Each
softmax is one call of the attention backend chosen for the forward pass (longdoc.model.backends:
eager PyTorch ops, the specification; the compiled C++ kernels on CPU; the GPU kernel; a dense
float64 reference).

Shapes below: B batch, h heads, d head size, Lp padded long length (a multiple of b), nb = Lp / b,
G global tokens, R relative vocabulary.
"""

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from longdoc.model.backends.base import AttentionBackend, SoftmaxOperands
from longdoc.model.config import GlobalLocalConfig
from longdoc.model.dropout import Dropout
from longdoc.model.linear import Linear
from longdoc.model.side_inputs import SideInputs


@dataclass
class AttentionCarry:
    """The raw scores one layer carries to the next under residual attention (RealFormer), per
    softmax, in the shapes they are computed in: long [B, h, nb, b, 3b + G], global [B, h, G, G + Lp]."""

    long_scores: Tensor | None = None
    global_scores: Tensor | None = None


@dataclass
class AttentionWeights:
    """One layer's attention weights (softmax rows, before talking heads' post mix and dropout), in
    the shapes the scores are computed in: `long` [B, h, nb, b, 3b + G] (query block n's row c:
    its window's long token (n - 1) b + c for c < 3b, global token c - 3b after), `global_` [B, h, G,
    G + Lp] (global tokens, then long tokens), None without global tokens; `block_size` b.

    With them, what reading them needs: each softmax's mask (`long_mask_bias`, `global_mask_bias`:
    the weights' shapes with 1 for h, 0 where a query may attend) and, under residual attention, the
    scores the layer received (`carried`, the previous layer's summed scores; empty in the first
    layer) and the summed scores it passed on (`summed`): the layer's own scores are their difference."""

    long: Tensor
    global_: Tensor | None
    block_size: int
    long_mask_bias: Tensor | None = None
    global_mask_bias: Tensor | None = None
    carried: AttentionCarry | None = None
    summed: AttentionCarry | None = None


class SoftmaxParameters(nn.Module):
    """The parameters of one of the two softmaxes (long queries, global queries) besides the
    projections: ETC's relative position terms, a key embedding `relative_key` E [R, h, d] and a
    bias `relative_bias` b [R, h] (None without relative positions), and the talking-heads mixes
    `talking_heads_pre` and `talking_heads_post` [h_out, h_in] on either side of the softmax (None
    without talking heads; identity at initialisation, so a fresh model attends plainly).
    """

    def __init__(self, config: GlobalLocalConfig):
        super().__init__()
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
        self.residual_attention = config.residual_attention
        self.residual_attention_mean = config.residual_attention_mean
        self.num_layers = config.num_hidden_layers
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
        self.long_softmax = SoftmaxParameters(config)
        self.global_softmax = SoftmaxParameters(config)

    def forward(
        self,
        long_hidden: Tensor,
        global_hidden: Tensor,
        side: SideInputs,
        carry: AttentionCarry | None,
        layer_number: int,
        backend: AttentionBackend,
    ) -> tuple[Tensor, Tensor, AttentionCarry, AttentionWeights | None]:
        """long_hidden [B, Lp, H], global_hidden [B, G, H] -> the attention outputs of both streams
        (after the output projections), the scores to carry, and the weights if `backend.keep_weights`.
        `backend`: the attention backend of this forward pass."""
        carry = carry or AttentionCarry()
        long_qkv = self.long_qkv(long_hidden)  # [B, Lp, 3H]
        global_qkv = (self.global_qkv or self.long_qkv)(global_hidden)  # [B, G, 3H]
        # The other stream's keys and values as each stream's queries read them: its fused
        # projection, or with cross_kv_projections their own ([B, G, 2H], [B, Lp, 2H]).
        global_kv_of_long, long_kv_of_global = global_qkv, long_qkv
        if self.long_queries_global_kv is not None:
            global_kv_of_long = self.long_queries_global_kv(global_hidden)
            long_kv_of_global = self.global_queries_long_kv(long_hidden)
        # Long queries, in blocks, over [previous | own | next block | all globals].
        long = backend.attend(self._operands(
            long_qkv, global_kv_of_long, side.block_size, side.long_mask_bias, side.long_relative_ids,
            self.long_softmax, side, carry.long_scores, layer_number, backend.keep_weights,
        ))
        long_out = self.long_output(long.context)
        weights = None
        if backend.keep_weights:
            weights = AttentionWeights(long.weights, None, side.block_size, side.long_mask_bias, side.global_mask_bias)
        if global_hidden.shape[1] == 0:
            return long_out, global_hidden, self._kept(AttentionCarry(long.summed), carry, weights), weights
        # Global queries over [all globals | all long tokens].
        global_ = backend.attend(self._operands(
            global_qkv, long_kv_of_global, 0, side.global_mask_bias, side.global_relative_ids,
            self.global_softmax, side, carry.global_scores, layer_number, backend.keep_weights,
        ))
        global_out = (self.global_output or self.long_output)(global_.context)
        if weights is not None:
            weights.global_ = global_.weights
        return long_out, global_out, self._kept(AttentionCarry(long.summed, global_.summed), carry, weights), weights

    def _kept(self, summed: AttentionCarry, carried: AttentionCarry, weights: AttentionWeights | None) -> AttentionCarry:
        """`summed`, recorded with the `carried` scores it was computed from in the kept `weights`
        under residual attention (the backends leave both intact when the weights are kept)."""
        if weights is not None and self.residual_attention:
            weights.carried, weights.summed = carried, summed
        return summed

    def _operands(
        self, own: Tensor, other: Tensor, window_block: int, mask_bias: Tensor, relative_ids: Tensor | None,
        softmax: "SoftmaxParameters", side: SideInputs, carried: Tensor | None, layer_number: int, keep_weights: bool,
    ) -> SoftmaxOperands:
        """One softmax's operands: the queries of `own` [B, Nq, 3H] over [its keys (with `window_block`
        b: the window of 3b around each block of b queries) | the keys of `other` [B, N2, 3H or 2H]]."""
        return SoftmaxOperands(
            own, other, self.num_heads, window_block, mask_bias, relative_ids, softmax.relative_key,
            softmax.relative_bias, side.relative_layout, side.links, carried, softmax.talking_heads_pre,
            softmax.talking_heads_post,
            scale=1.0 / layer_number if self.residual_attention_mean else 1.0,
            drop_probability=self.dropout.p if self.training else 0.0,
            # (the last layer's sums go nowhere unless kept for inspection: not written, 100 MB a
            # softmax at 4096 tokens)
            keep_summed=self.residual_attention and (layer_number < self.num_layers or keep_weights),
            keep_weights=keep_weights,
        )


# The per-softmax parameters under the attention module's own names (`long_relative_key`, ...), as weights
# written before SoftmaxParameters held them name them -> their names now. Such weights are refused on
# load (GlobalLocalPreTrainedModel.from_pretrained) until `longdoc upgrade` rewrites them once.
OLD_PARAMETER_NAMES = {
    f"{softmax}_{parameter}": f"{softmax}_softmax.{parameter}"
    for softmax in ("long", "global")
    for parameter in ("relative_key", "relative_bias", "talking_heads_pre", "talking_heads_post")
}
