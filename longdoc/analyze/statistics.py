"""The statistics of attention rows: entropy, sparsity, layer-to-layer divergence, carried share.

Every function takes rows of one attention piece for all heads at once: `weights` [h, R, K] (R query
rows, K key columns, 0 on keys the query may not attend to) and `seen` [R, K] bool (the keys each
query may attend to, the same for every head), and gives one value per head and row, [h, R], NaN
where the statistic has no value for that row (a piece with no key seen, or no weight on it).

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

import torch
from torch import Tensor


def renormalized(weights: Tensor, seen: Tensor) -> tuple[Tensor, Tensor]:
    """(weights over the keys seen renormalised to sum to 1 per row [h, R, K], whether a row has any
    weight there [h, R])."""
    weights = weights.masked_fill(~seen, 0.0)
    mass = weights.sum(-1, keepdim=True)
    has_weight = mass.squeeze(-1) > 0
    return weights / torch.where(mass > 0, mass, torch.ones_like(mass)), has_weight


def entropy(weights: Tensor, seen: Tensor, normalized: bool = False) -> Tensor:
    """[h, R] entropy in nats of each row's renormalised weights; `normalized`: over log(keys seen)."""
    probabilities, has_weight = renormalized(weights, seen)
    values = -torch.special.xlogy(probabilities, probabilities).sum(-1)
    keys = seen.sum(-1).to(values.dtype).expand_as(values)
    valid = has_weight
    if normalized:
        valid = valid & (keys >= 2)
        values = values / torch.where(keys >= 2, keys.log(), torch.ones_like(keys))
    return values.masked_fill(~valid, math.nan)


def top_share(weights: Tensor, seen: Tensor, fraction: float) -> Tensor:
    """[h, R] the weight of each row's top ceil(fraction x keys seen) keys (at least one), renormalised."""
    probabilities, has_weight = renormalized(weights, seen)
    keys = seen.sum(-1)
    count = torch.clamp(torch.ceil(fraction * keys.to(torch.float64)).long(), min=1).clamp(max=seen.shape[-1])
    running = probabilities.sort(-1, descending=True).values.cumsum(-1)
    index = (count - 1).expand(running.shape[:-1]).unsqueeze(-1)
    values = running.gather(-1, index).squeeze(-1).clamp(max=1.0)
    return values.masked_fill(~(has_weight & (keys > 0)), math.nan)


def js_divergence(weights: Tensor, next_weights: Tensor, seen: Tensor) -> Tensor:
    """[h, R] the Jensen-Shannon divergence (nats) between each row's renormalised weights in one layer
    (`weights`) and in the next (`next_weights`), head by head."""
    first, first_valid = renormalized(weights, seen)
    second, second_valid = renormalized(next_weights, seen)
    middle = (first + second) / 2

    def divergence(p: Tensor) -> Tensor:  # KL(p || middle); middle > 0 wherever p > 0
        return (torch.special.xlogy(p, p) - torch.special.xlogy(p, middle)).sum(-1)

    values = (0.5 * divergence(first) + 0.5 * divergence(second)).clamp(min=0.0)
    return values.masked_fill(~(first_valid & second_valid), math.nan)


def centred(scores: Tensor, seen: Tensor) -> Tensor:
    """Scores [h, R, K] minus their mean over each row's keys seen; 0 on the keys not seen."""
    scores = scores.masked_fill(~seen, 0.0)
    keys = seen.sum(-1, keepdim=True).clamp(min=1)
    return (scores - scores.sum(-1, keepdim=True) / keys).masked_fill(~seen, 0.0)


def carried_share(own: Tensor, carried: Tensor, seen: Tensor) -> Tensor:
    """[h, R] the carried scores' share of the softmax's input over the keys seen (module docstring);
    `own` and `carried` already `centred` over the whole softmax row."""
    carried_size = carried.abs().masked_fill(~seen, 0.0).sum(-1)
    own_size = own.abs().masked_fill(~seen, 0.0).sum(-1)
    total = carried_size + own_size
    values = carried_size / torch.where(total > 0, total, torch.ones_like(total))
    return values.masked_fill(~(seen.any(-1) & (total > 0)).expand_as(values), math.nan)


def piece_weight(weights: Tensor, seen: Tensor) -> Tensor:
    """[h, R] the share of each row's weight on the piece's keys (its whole row sums to 1)."""
    values = weights.masked_fill(~seen, 0.0).sum(-1)
    return values.masked_fill(~seen.any(-1).expand_as(values), math.nan)
