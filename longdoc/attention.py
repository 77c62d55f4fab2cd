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

from longdoc.config import GlobalLocalConfig
from longdoc.side_inputs import SideInputs


@dataclass
class AttentionScores:
    """The raw scores a layer carries to the next under residual attention, per softmax:
    long [B, h, nb, b, W + G] and global [B, h, G, G + Lp] (None when G = 0)."""

    long: Tensor
    global_: Tensor | None


class GlobalLocalAttention(nn.Module):
    """Projections, the two softmaxes and the output projections for both streams."""

    def __init__(self, config: GlobalLocalConfig):
        super().__init__()
        hidden, heads = config.hidden_size, config.num_attention_heads
        self.num_heads = heads
        self.head_size = config.head_size
        self.residual_attention = config.residual_attention
        self.residual_attention_mean = config.residual_attention_mean
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

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
        previous_scores: AttentionScores | None,
        layer_number: int,
    ) -> tuple[Tensor, Tensor, AttentionScores | None]:
        """long_hidden [B, Lp, H], global_hidden [B, G, H] -> the attention outputs of both streams
        (after the output projections) and the scores to carry (None without residual attention)."""
        batch, padded_length, hidden = long_hidden.shape
        num_globals = global_hidden.shape[1]
        b, nb = side.block_size, side.num_blocks

        long_q, long_k, long_v = self._split_heads(self.long_qkv(long_hidden))  # [B, h, Lp, d] each
        global_q, global_k, global_v = self._split_heads((self.global_qkv or self.long_qkv)(global_hidden))

        # --- long queries over [window | globals] ---
        window_k = self._window_keys(long_k, global_k, b, nb)  # [B, h, nb, W + G, d]
        window_v = self._window_keys(long_v, global_v, b, nb)
        long_q_blocks = long_q.view(batch, self.num_heads, nb, b, self.head_size)
        long_scores = self._scores(
            long_q_blocks, window_k, side.long_relative_ids, "long",
            previous_scores.long if previous_scores is not None else None,
        )
        long_probs = self._probabilities(long_scores, side.long_mask_bias, layer_number, "long")
        long_context = torch.matmul(long_probs, window_v)  # [B, h, nb, b, d]
        long_context = long_context.view(batch, self.num_heads, padded_length, self.head_size)
        long_out = self.long_output(self._merge_heads(long_context))

        # --- global queries over [globals | all long tokens] ---
        global_scores = None
        if num_globals > 0:
            all_k = torch.cat([global_k, long_k], dim=2)  # [B, h, G + Lp, d]
            all_v = torch.cat([global_v, long_v], dim=2)
            global_scores = self._scores(
                global_q, all_k, side.global_relative_ids, "global",
                previous_scores.global_ if previous_scores is not None else None,
            )
            global_probs = self._probabilities(global_scores, side.global_mask_bias, layer_number, "global")
            global_context = torch.matmul(global_probs, all_v)  # [B, h, G, d]
            global_out = (self.global_output or self.long_output)(self._merge_heads(global_context))
        else:
            global_out = global_hidden

        carried = AttentionScores(long_scores, global_scores) if self.residual_attention else None
        return long_out, global_out, carried

    def _split_heads(self, qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """[B, N, 3H] -> three [B, h, N, d]; the query is pre-scaled by 1/sqrt(d)."""
        batch, length, _ = qkv.shape
        qkv = qkv.view(batch, length, 3, self.num_heads, self.head_size).permute(2, 0, 3, 1, 4)
        query, key, value = qkv.unbind(0)
        return query * (1.0 / math.sqrt(self.head_size)), key.contiguous(), value.contiguous()

    def _merge_heads(self, context: Tensor) -> Tensor:
        """[B, h, N, d] -> [B, N, H]."""
        batch, _, length, _ = context.shape
        return context.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_size)

    @staticmethod
    def _window_keys(long_k: Tensor, global_k: Tensor, b: int, nb: int) -> Tensor:
        """Keys of each query block: previous, own and next long block, then all globals.

        long_k [B, h, nb * b, d], global_k [B, h, G, d] -> [B, h, nb, 3b + G, d]. One copy of the
        keys (3 + G / b times their size), small next to the [.., b, 3b + G] scores it enables as a
        single batched matmul.
        """
        batch, heads, _, size = long_k.shape
        padded = F.pad(long_k, (0, 0, b, b)).view(batch, heads, nb + 2, b, size)
        pieces = [padded[:, :, :-2], padded[:, :, 1:-1], padded[:, :, 2:]]
        if global_k.shape[2] > 0:
            pieces.append(global_k.unsqueeze(2).expand(batch, heads, nb, global_k.shape[2], size))
        return torch.cat(pieces, dim=3)

    def _scores(
        self, query: Tensor, key: Tensor, relative_ids: Tensor | None, softmax: str, previous: Tensor | None
    ) -> Tensor:
        """Raw scores q.k/sqrt(d) (+ relative terms) (+ the previous layer's carried scores).

        query [..., Nq, d] (pre-scaled), key [..., Nk, d] with the same leading dims -> [..., Nq, Nk].
        """
        if relative_ids is None:
            scores = torch.matmul(query, key.transpose(-1, -2))
        else:
            # q.E[id] + b[id] for all R ids at once ([..., Nq, R], small), then picked per pair.
            table = getattr(self, f"{softmax}_relative_key")  # [R, h, d]
            bias = getattr(self, f"{softmax}_relative_bias")  # [R, h]
            query_by_head = query.movedim(1, -3)  # [B, ..., h, Nq, d]: h next to the queries
            relative = torch.matmul(query_by_head, table.permute(1, 2, 0))  # [B, ..., h, Nq, R]
            relative = relative.movedim(-3, 1) + (bias.t() / math.sqrt(self.head_size)).view(
                1, -1, *([1] * (query.dim() - 3)), bias.shape[0]
            )
            relative = torch.gather(relative, -1, relative_ids.expand(*query.shape[:-1], key.shape[-2]))
            # relative + query @ key^T in one kernel (batched over all leading dims)
            lead = query.shape[:-2]
            scores = torch.baddbmm(
                relative.reshape(-1, query.shape[-2], key.shape[-2]),
                query.reshape(-1, *query.shape[-2:]),
                key.reshape(-1, *key.shape[-2:]).transpose(1, 2),
            ).view(*lead, query.shape[-2], key.shape[-2])
        if previous is not None:
            # In place is safe for autograd: no backward needs these scores' values.
            scores.add_(previous)
        return scores

    def _probabilities(self, scores: Tensor, mask_bias: Tensor, layer_number: int, softmax: str) -> Tensor:
        """Carried scores -> attention weights: (running mean) -> talking heads -> mask -> softmax."""
        logits = scores
        if self.residual_attention_mean:
            logits = logits / layer_number
        if self.talking_heads:
            logits = self._mix_heads(logits, getattr(self, f"{softmax}_talking_heads_pre"))
        probs = torch.softmax(logits + mask_bias, dim=-1)
        if self.talking_heads:
            probs = self._mix_heads(probs, getattr(self, f"{softmax}_talking_heads_post"))
        return self.dropout(probs)

    @staticmethod
    def _mix_heads(values: Tensor, mixing: Tensor) -> Tensor:
        """Mix [B, h, ...] across heads with mixing [h_out, h_in]: one matmul over the flattened pairs."""
        batch, heads = values.shape[:2]
        mixed = torch.matmul(mixing, values.reshape(batch, heads, -1))
        return mixed.view(values.shape)
