"""The gradient of the relative position terms from that of the scores they were added to.

Each pair of a softmax adds its relative term, relative[..., q, ids[..., q, c]], to its score, so the
gradient of relative [B, h, ..., Nq, R] sums the scores' gradient by id. A scatter-add over every
[.., b, 3b + G] pair was training's largest non-matmul op at 4k tokens; this sums by the ids'
structure instead (longdoc.model.side_inputs). The key columns are [head | long-global pairs]; a
pair's id there is "linked" when the long token links to the global one (`links` [B, Lp, 2]), else
"unlinked", so their gradient is a sum per query over the row and over at most two linked entries.
The long softmax (`block_size` b given) has queries [.., nb, b] and a head of 3b window keys whose
ids depend only on the query p and the key column c (side_inputs.local_relative_ids): their sums by
id are a batched product with the ids' one-hot. The global softmax has G queries and a G x G head,
whose gradient is a (small) scatter-add. The eager, cpu and gpu backends use it.
"""

import torch
from torch import Tensor

from longdoc.model.side_inputs import RelativeIdLayout, local_relative_ids


def relative_gradient(grad_picked: Tensor, ids: Tensor, links: Tensor | None, layout: RelativeIdLayout,
                      block_size: int | None, relative_shape: torch.Size) -> Tensor:
    """The gradient of the relative terms [B, h, ..., Nq, R] from grad_picked, that of each pair's term
    (the scores' shape); ids: the pairs' ids (int64); block_size: b for the long softmax, None for the global one."""
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
    """Add to grad [.., b, R] the gradient of the window's relative terms, grad_window [.., b, 3b].

    The window's ids depend only on the query p and the key column c (local_relative_ids), so the sum
    by id is, for each p, the product of the rows of query p [M, 3b] with the ids' one-hot [3b, R]: one
    batched product over p (the unclipped ids' columns picked and the clipped ids' prefix and suffix
    sums, each a pass of its own, made the function take 1.4x the time: docs/benchmarks.md)."""
    rows = grad_window.flatten(0, -3).transpose(0, 1)  # [b, M, 3b], a view
    ids = local_relative_ids(b, layout, grad_window.device)  # [b, 3b]
    one_hot = grad_window.new_zeros(b, 3 * b, grad.shape[-1]).scatter_(-1, ids.unsqueeze(-1), 1.0)
    grad += torch.bmm(rows, one_hot).transpose(0, 1).view(grad.shape)


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
