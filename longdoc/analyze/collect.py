"""One batch's kept attention -> the statistics of every layer, head and piece, added to a Summary.

Layers are read in order, each after the previous one, so that the Jensen-Shannon divergence of a
layer pair needs two layers' rows at a time. Statistics are computed in the weights' dtype (float32 in
float32 and lower precisions, float64 for a float64 model).
"""

from typing import Sequence

import torch
from torch import Tensor

from longdoc.analyze import statistics
from longdoc.analyze.pieces import SoftmaxRows, layer_rows
from longdoc.analyze.summary import BY_NAME, TOP_FRACTIONS, Summary
from longdoc.model.attention import AttentionWeights


def _computed(rows: SoftmaxRows) -> SoftmaxRows:
    """`rows` in a dtype the statistics can be computed in (float32 for half precisions)."""
    if rows.weights.dtype in (torch.float32, torch.float64):
        return rows
    as_float = lambda tensor: None if tensor is None else tensor.float()
    return SoftmaxRows(rows.name, rows.weights.float(), rows.seen, rows.split, as_float(rows.own),
                       as_float(rows.carried))


def add_batch(summary: Summary, attention: Sequence[AttentionWeights], long_mask: Tensor, global_mask: Tensor,
              groups: frozenset[str]) -> None:
    """Add the statistics of `groups` (longdoc.analyze.STATISTIC_GROUPS) of every layer of one batch's
    kept attention to `summary`; `long_mask` [B, L], `global_mask` [B, G]: the real tokens."""
    previous: dict[str, statistics.PieceRows] = {}  # the layer before's rows, by piece
    for layer, kept in enumerate(attention):
        current = {}
        for rows in layer_rows(kept, long_mask.bool(), global_mask.bool()):
            rows = _computed(rows)
            sizes = None
            if "carried-share" in groups and rows.own is not None:
                sizes = statistics.centred_size(rows.own, rows.seen), statistics.centred_size(rows.carried, rows.seen)
            for piece, columns in rows.pieces().items():
                seen = rows.seen[..., columns]
                renormalized = current[piece] = statistics.piece_rows(rows.weights[..., columns], seen)
                if "entropy" in groups:
                    entropies = statistics.entropy(renormalized)
                    summary.add(BY_NAME["entropy"], piece, layer, entropies)
                    summary.add(BY_NAME["normalized_entropy"], piece, layer,
                                statistics.normalized_entropy(renormalized, entropies))
                if "sparsity" in groups:
                    for name, values in statistics.top_shares(renormalized, TOP_FRACTIONS).items():
                        summary.add(BY_NAME[name], piece, layer, values)
                    if piece != rows.name:
                        summary.add(BY_NAME["piece_weight"], piece, layer, statistics.piece_weight(renormalized))
                if sizes is not None:
                    summary.add(BY_NAME["carried_share"], piece, layer,
                                statistics.carried_share(sizes[0][..., columns], sizes[1][..., columns], seen))
                if "divergence" in groups and piece in previous:
                    summary.add(BY_NAME["js_divergence"], piece, layer - 1,
                                statistics.js_divergence(previous[piece], renormalized))
        previous = current
