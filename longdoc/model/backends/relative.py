"""The gradient of the relative position terms from that of the scores they were added to.

Each pair of a softmax adds its relative term, relative[..., q, ids[..., q, c]], to its score, so the
gradient of relative [B, h, ..., Nq, R] sums the scores' gradient by id. A scatter-add over every
[.., b, 3b + G] pair was training's largest non-matmul op at 4k tokens; this sums by the ids'
structure instead (longdoc.model.side_inputs). The key columns are [head | long-global pairs]; a
pair's id there is "linked" when the long token links to the global one (`links` [B, Lp, 2]), else
"unlinked", so their gradient is a sum per query over the row and over at most two linked entries.
The long softmax (`block_size` b given) has queries [.., nb, b] and a head of 3b window keys whose
ids depend only on the distance c - b - p (side_inputs.local_relative_ids): each unclipped id is one
column per query, and the two clipped ids are a prefix and a suffix of the row, whose bounds step
by one column a query. The global softmax has G queries and a G x G head, whose gradient is a (small)
scatter-add. The eager and the cpu backends use it.
"""

import torch
from torch import Tensor

from longdoc.model.side_inputs import RelativeIdLayout


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
    """Add to grad [.., b, R] the gradient of the window's relative terms, grad_window [.., b, 3b]."""
    k, width = layout.max_distance, grad_window.shape[-1]
    device = grad_window.device
    query = torch.arange(b, device=device).view(-1, 1)
    # Unclipped distances -k < d < k: key column b + p + d of query p, one per (p, d) (or none).
    distances = torch.arange(-k + 1, k, device=device)
    columns = b + query + distances  # [b, 2k - 1]
    inside = (columns >= 0) & (columns < width)
    picked = torch.gather(grad_window, -1, columns.clamp(0, width - 1).expand(*grad_window.shape[:-1], -1))
    picked = picked * inside.to(picked.dtype)  # [.., b, 2k - 1]: distances -k + 1 .. k - 1
    # Their ids are two runs (layout.right, layout.left): slices, where indexing by the ids cost a gather and a scatter.
    grad[..., layout.right(0) : layout.right(k - 1) + 1] += picked[..., k - 1 :]
    grad[..., layout.left(1) : layout.left(k - 1) + 1] += picked[..., : k - 1].flip(-1)
    # Clipped: d <= -k is the prefix c <= b + p - k, d >= k the suffix c >= b + p + k.
    grad[..., layout.left_clipped] += _staircase_sums(grad_window, b - k, prefix=True)
    grad[..., layout.right_clipped] += _staircase_sums(grad_window, b + k, prefix=False)


def _staircase_sums(rows: Tensor, bound: int, prefix: bool) -> Tensor:
    """rows [.., b, W] -> [.., b]: row p's sum over the columns c <= bound + p (`prefix`), else c >= bound + p.
    The columns on the summed side of every row's bound are one plain sum; only the b - 1 columns
    between the first row's bound and the last row's are masked. (A running sum over each whole row,
    torch's cumsum, adds one element after another and wrote the whole [.., b, W] sum: the long
    softmax's relative gradient took 1.7x the time with it, docs/benchmarks.md.)"""
    b, width = rows.shape[-2:]
    lo, hi = (bound + 1, bound + b) if prefix else (bound, bound + b - 1)  # the columns where rows differ
    lo, hi = min(max(lo, 0), width), min(max(hi, 0), width)
    common = rows[..., :lo] if prefix else rows[..., hi:]
    total = common.sum(-1)
    if lo < hi:
        columns = torch.arange(lo, hi, device=rows.device)
        query = torch.arange(b, device=rows.device).view(-1, 1)
        kept = columns <= bound + query if prefix else columns >= bound + query  # [b, hi - lo]
        total = total + (rows[..., lo:hi] * kept.to(rows.dtype)).sum(-1)  # (a bool mask's product: twice the time)
    return total


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
