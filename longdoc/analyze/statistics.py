"""The statistics of attention rows: entropy, sparsity, layer-to-layer divergence, carried share.

A piece's rows of all heads, `weights` [h, R, K] (R query rows, K key columns, 0 on keys the query may
not attend to) with `seen` [R, K] bool (the keys each query may attend to, the same for every head),
are renormalised once into `PieceRows`, which every statistic of the piece reads (and the divergence
of the next layer with it); each statistic gives one value per head and row, [h, R], NaN where it
has no value for that row (a piece with no key seen, or no weight on it).

The definitions follow the papers that drew them:
- entropy (RealFormer, He et al., 2020, arXiv:2012.11747, figure 4): -sum p log p in nats over the
  keys seen, of the piece's weights renormalised to sum to 1 (how spread a query's attention is within
  the piece); `normalized`: divided by log(keys seen), so that a global query seeing thousands of keys
  and a long query seeing a window of a few hundred compare (1: uniform, 0: one key; no value with
  fewer than 2 keys seen);
- top share: the weight on the top `fraction` of the keys seen (at least one key), of the same
  renormalised weights: high means sparse;
- Jensen-Shannon divergence (RealFormer, figure 5): between the same head's renormalised rows in two
  adjacent layers, in nats (0 to log 2);
- carried share (residual attention): of the softmax's input summed + carried = own + carried, the
  share that comes from the carried scores, sum |c| / (sum |c| + sum |o|) over the keys seen, each
  centred first by its mean over the row's keys seen (a softmax ignores what is added to a whole
  row). With talking heads the input is mixed across heads after this sum; with the running mean it
  is scaled, which leaves the share unchanged.
"""

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class PieceRows:
    """One piece's rows renormalised over the keys seen: `probabilities` [h, R, K] (0 off the keys seen),
    `mass` [h, R] (the weight the whole softmax row puts on the piece, before renormalising), `keys`
    [R] (how many keys each row sees) and `plogp` [h, R, K] (p log p, 0 where p is 0: the entropy and
    the divergence both read it)."""

    probabilities: Tensor
    mass: Tensor
    keys: Tensor
    plogp: Tensor

    @property
    def has_weight(self) -> Tensor:
        return self.mass > 0


def piece_rows(weights: Tensor, seen: Tensor) -> PieceRows:
    """`weights` [h, R, K] over the keys `seen` [R, K], renormalised to sum to 1 per row."""
    weights = weights.masked_fill(~seen, 0.0)
    mass = weights.sum(-1, keepdim=True)
    probabilities = weights / torch.where(mass > 0, mass, torch.ones_like(mass))
    return PieceRows(probabilities, mass.squeeze(-1), seen.sum(-1), torch.special.xlogy(probabilities, probabilities))


def entropy(rows: PieceRows) -> Tensor:
    """[h, R] entropy in nats of each row."""
    return (-rows.plogp.sum(-1)).masked_fill(~rows.has_weight, math.nan)


def normalized_entropy(rows: PieceRows, entropies: Tensor) -> Tensor:
    """[h, R] the `entropies` of `rows` over log(keys seen), for rows with 2 keys or more."""
    keys = rows.keys.to(entropies.dtype).expand_as(entropies)
    values = entropies / torch.where(keys >= 2, keys.log(), torch.ones_like(keys))
    return values.masked_fill(~(rows.has_weight & (keys >= 2)), math.nan)


def top_shares(rows: PieceRows, fractions: dict[str, float]) -> dict[str, Tensor]:
    """{name: [h, R] the weight of each row's top ceil(fraction x keys seen) keys (at least one)} for
    each of `fractions`: one partial sort of every row, as far as the largest count."""
    width = rows.probabilities.shape[-1]
    invalid = ~(rows.has_weight & (rows.keys > 0))
    if width == 0:
        return {name: torch.full(invalid.shape, math.nan, dtype=rows.probabilities.dtype) for name in fractions}
    counts = {name: torch.ceil(fraction * rows.keys.to(torch.float64)).long().clamp(min=1).clamp(max=width)
              for name, fraction in fractions.items()}
    largest = max(int(count.max()) for count in counts.values())
    running = rows.probabilities.topk(largest, dim=-1).values.cumsum(-1)
    shares = {}
    for name, count in counts.items():
        index = (count - 1).expand(running.shape[:-1]).unsqueeze(-1)
        shares[name] = running.gather(-1, index).squeeze(-1).clamp(max=1.0).masked_fill(invalid, math.nan)
    return shares


def js_divergence(first: PieceRows, second: PieceRows) -> Tensor:
    """[h, R] the Jensen-Shannon divergence (nats) between each row of a piece in one layer (`first`)
    and the same row in the next (`second`), head by head."""
    middle = (first.probabilities + second.probabilities) / 2

    def divergence(rows: PieceRows) -> Tensor:  # KL(p || middle); middle > 0 wherever p > 0
        return (rows.plogp - torch.special.xlogy(rows.probabilities, middle)).sum(-1)

    values = (0.5 * divergence(first) + 0.5 * divergence(second)).clamp(min=0.0)
    return values.masked_fill(~(first.has_weight & second.has_weight), math.nan)


def centred_size(scores: Tensor, seen: Tensor) -> Tensor:
    """|scores [h, R, K] minus their mean over each row's keys seen|; 0 on the keys not seen."""
    scores = scores.masked_fill(~seen, 0.0)
    keys = seen.sum(-1, keepdim=True).clamp(min=1)
    return (scores - scores.sum(-1, keepdim=True) / keys).masked_fill(~seen, 0.0).abs()


def carried_share(own_size: Tensor, carried_size: Tensor, seen: Tensor) -> Tensor:
    """[h, R] the carried scores' share of the softmax's input over a piece's keys `seen` (module
    docstring); `own_size` and `carried_size`: the piece's columns of `centred_size` of the own and
    carried scores, centred over the whole softmax row."""
    carried_total, own_total = carried_size.sum(-1), own_size.sum(-1)
    total = carried_total + own_total
    values = carried_total / torch.where(total > 0, total, torch.ones_like(total))
    return values.masked_fill(~(seen.any(-1) & (total > 0)).expand_as(values), math.nan)


def piece_weight(rows: PieceRows) -> Tensor:
    """[h, R] the share of each row's weight on the piece's keys (its whole row sums to 1)."""
    return rows.mass.masked_fill(~(rows.keys > 0).expand_as(rows.mass), math.nan)
