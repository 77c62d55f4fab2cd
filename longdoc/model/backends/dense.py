"""The dense backend: a float64 reference of one softmax, from the same operands, un-blocked.

Every query's row holds every key, [all first keys | all second keys], in float64: q.k for all of
them in one product, each pair's relative term and carried score read from the operands where the
blocked layout holds the pair, every other key of the row masked, then the softmax and the product
with the values over the whole row. The blocked pairs are placed in the full rows by index (a key
of the window beyond the ends of the input is a zero key, masked, as in the eager backend), so it
checks the window's keys and values, the zero padding and the key ranges of the other backends
without sharing their layout code. The summed scores and the weights go back to the blocked shape.
Results are cast to the operands' dtype. Slow (scores [B, h, Nq, N1 + N2]): for checking, on any device.

A query that may attend to no key (padding) gets uniform weights over its row, here every key,
where the blocked backends spread it over the keys of their row: its context differs, and means
nothing (no other token attends to a padding token).
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from longdoc.model.backends.base import AttentionBackend, SoftmaxOperands, SoftmaxResult, merge_heads
from longdoc.model.dropout import dropout


def full_columns(window_block: int, num_queries: int, first_keys: int, second_keys: int, device) -> Tensor:
    """The column in a full row [first keys | second keys | one zero key] of every pair of the
    blocked layout: [nb, b, 3b + N2] with `window_block` b > 0 (query block n's window column c is
    first key (n - 1) b + c, the zero key beyond the ends), [Nq, N1 + N2] with 0."""
    everything = first_keys + second_keys
    if window_block == 0:
        return torch.arange(everything, device=device).expand(num_queries, everything)
    b, blocks = window_block, num_queries // window_block
    window = (torch.arange(blocks, device=device) * b - b).view(blocks, 1, 1) + torch.arange(3 * b, device=device)
    window = torch.where((window >= 0) & (window < first_keys), window, everything)  # [nb, 1, 3b]
    second = first_keys + torch.arange(second_keys, device=device)
    return torch.cat([window.expand(blocks, b, 3 * b), second.expand(blocks, b, second_keys)], dim=-1)


def _mix_heads(mixing: Tensor, values: Tensor) -> Tensor:
    """values [B, h_in, ...] mixed across heads by mixing [h_out, h_in]."""
    return torch.einsum("gh,bh...->bg...", mixing.double(), values)


class DenseBackend(AttentionBackend):
    name = "dense"

    def attend(self, operands: SoftmaxOperands) -> SoftmaxResult:
        dtype = operands.own.dtype
        query, first_keys, first_values, second_keys, second_values = (t.double() for t in operands.heads())
        batch, heads, num_queries, size = query.shape
        scores_shape = operands.scores_shape
        columns = full_columns(operands.window_block, num_queries, first_keys.shape[2], second_keys.shape[2],
                               query.device).expand(*scores_shape)  # [B, h, (nb, b | Nq), N]
        keys, values = torch.cat([first_keys, second_keys], 2), torch.cat([first_values, second_values], 2)
        products = F.pad(query @ keys.transpose(-1, -2) * operands.query_scale, (0, 1))  # [B, h, Nq, N1 + N2 + 1]
        summed = products.view(*scores_shape[:-1], -1).gather(-1, columns)
        if operands.relative_ids is not None:  # (q.E[id] + b[id]) / sqrt(d), every id, then each pair's
            terms = torch.einsum("bhqd,rhd->bhqr", query, operands.relative_key.double())
            terms = (terms + operands.relative_bias.double().t().unsqueeze(1)) / math.sqrt(size)
            summed = summed + terms.view(*scores_shape[:-1], -1).gather(-1, operands.relative_ids.expand(scores_shape))
        if operands.carried is not None:
            summed = summed + operands.carried.double()
        logits = summed if operands.talking_heads_pre is None else _mix_heads(operands.talking_heads_pre, summed)
        logits = operands.scale * logits + operands.mask_bias.double()
        masked = torch.finfo(operands.mask_bias.dtype).min / 2
        full = products.new_full(products.shape, masked).scatter(-1, self._rows(columns), self._rows(logits))
        probs = torch.softmax(full[..., :-1], dim=-1)  # [B, h, Nq, N1 + N2], the zero key left out
        weights = probs if operands.talking_heads_post is None else _mix_heads(operands.talking_heads_post, probs)
        if operands.drop_probability > 0:  # the eager backend's draw, of the blocked weights' shape
            kept = dropout(operands.own.new_ones(scores_shape), operands.drop_probability).double()
            weights = weights * torch.ones_like(products).scatter(-1, self._rows(columns), self._rows(kept))[..., :-1]
        context = merge_heads(weights @ values).to(dtype)
        blocked_weights = None
        if operands.keep_weights:
            blocked_weights = F.pad(probs, (0, 1)).view(*scores_shape[:-1], -1).gather(-1, columns).to(dtype)
        return SoftmaxResult(context, summed.to(dtype) if operands.keep_summed else None, blocked_weights)

    @staticmethod
    def _rows(blocked: Tensor) -> Tensor:
        """The scores' shape -> [B, h, Nq, N]: the blocked queries' rows as rows of queries."""
        return blocked.reshape(*blocked.shape[:2], -1, blocked.shape[-1])
