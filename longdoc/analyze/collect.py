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
    previous: dict[str, SoftmaxRows] = {}
    for layer, kept in enumerate(attention):
        current = {}
        for rows in layer_rows(kept, long_mask.bool(), global_mask.bool()):
            rows = current[rows.name] = _computed(rows)
            own = carried = None
            if "carried-share" in groups and rows.own is not None:
                own, carried = statistics.centred(rows.own, rows.seen), statistics.centred(rows.carried, rows.seen)
            for piece, columns in rows.pieces().items():
                weights, seen = rows.weights[..., columns], rows.seen[..., columns]
                if "entropy" in groups:
                    summary.add(BY_NAME["entropy"], piece, layer, statistics.entropy(weights, seen))
                    summary.add(BY_NAME["normalized_entropy"], piece, layer,
                                statistics.entropy(weights, seen, normalized=True))
                if "sparsity" in groups:
                    for name, fraction in TOP_FRACTIONS.items():
                        summary.add(BY_NAME[name], piece, layer, statistics.top_share(weights, seen, fraction))
                    if piece != rows.name:
                        summary.add(BY_NAME["piece_weight"], piece, layer, statistics.piece_weight(weights, seen))
                if own is not None:
                    summary.add(BY_NAME["carried_share"], piece, layer,
                                statistics.carried_share(own[..., columns], carried[..., columns], seen))
                if "divergence" in groups and rows.name in previous:
                    before = previous[rows.name].weights[..., columns]
                    summary.add(BY_NAME["js_divergence"], piece, layer - 1,
                                statistics.js_divergence(before, weights, seen))
        previous = current
