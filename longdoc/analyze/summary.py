"""The statistics `longdoc analyze attention` reports, and their summaries over many rows.

Each statistic (longdoc.analyze.statistics) gives one value per head and query row; a `Summary`
keeps, per statistic, piece, layer (or pair of adjacent layers) and head, the count, sum and sum of
squares of the values (exact means and standard deviations), and a uniform random sample of at most
`SAMPLE` of them (all of them when there are fewer), from which the quantiles are read: exact up to
SAMPLE values, within about 1.5% in rank beyond. The sample is drawn by giving each value a random key
and keeping the SAMPLE smallest keys, from a generator of fixed seed: the same data gives the same
figures. Its `as_json` is the "statistics" part of analysis.json.
"""

import math
from dataclasses import dataclass

import torch
from torch import Tensor

SAMPLE = 1024
QUANTILES = {"p5": 0.05, "p25": 0.25, "p50": 0.5, "p75": 0.75, "p95": 0.95}


@dataclass(frozen=True)
class Statistic:
    """One statistic: `name` in analysis.json, the `group` --statistics selects it by
    (longdoc.analyze.STATISTIC_GROUPS), its unit, what it is, and whether it compares two adjacent layers."""

    name: str
    group: str
    unit: str
    description: str
    between_layers: bool = False


TOP_FRACTIONS = {"top_1pct": 0.01, "top_5pct": 0.05, "top_10pct": 0.10}
STATISTICS = (
    Statistic("entropy", "entropy", "nats",
              "entropy of a query's weights over the piece's keys it may attend to, renormalised to sum to 1"),
    Statistic("normalized_entropy", "entropy", "fraction of log(keys seen)",
              "the entropy over the log of the number of keys the query may attend to in the piece (1: uniform; "
              "rows with 2 keys or more)"),
    *(Statistic(name, "sparsity", "fraction of the weight",
                f"weight on the top {round(fraction * 100)}% of the keys the query may attend to in the piece "
                "(at least one key), of its renormalised weights")
      for name, fraction in TOP_FRACTIONS.items()),
    Statistic("piece_weight", "sparsity", "fraction of the weight",
              "share of the query's whole softmax row that falls on this piece"),
    Statistic("js_divergence", "divergence", "nats",
              "Jensen-Shannon divergence between a head's renormalised weights in one layer and the same head's in "
              "the next, per query", between_layers=True),
    Statistic("carried_share", "carried-share", "fraction",
              "of the softmax's input (own + carried scores, each centred over the row's keys), the share "
              "sum|carried| / (sum|carried| + sum|own|) over the piece's keys; 0 in the first layer"),
)
BY_NAME = {statistic.name: statistic for statistic in STATISTICS}


class _Cell:
    """Per head (the first axis, of `heads`): count, sum and sum of squares of the values, and a sample."""

    def __init__(self, heads: int):
        self.count = torch.zeros(heads, dtype=torch.int64)
        self.total = torch.zeros(heads, dtype=torch.float64)
        self.squares = torch.zeros(heads, dtype=torch.float64)
        self.sample = torch.empty(heads, 0, dtype=torch.float64)
        self.keys = torch.empty(heads, 0, dtype=torch.float64)  # inf: no value

    def add(self, values: Tensor, generator: torch.Generator) -> None:
        """values [heads, R], float64 on the CPU, NaN for none."""
        valid = ~values.isnan()
        self.count += valid.sum(-1)
        self.total += values.nan_to_num(0.0).sum(-1)
        self.squares += values.nan_to_num(0.0).square().sum(-1)
        keys = torch.rand(values.shape, generator=generator, dtype=torch.float64).masked_fill(~valid, math.inf)
        self.sample, self.keys = torch.cat([self.sample, values], -1), torch.cat([self.keys, keys], -1)
        if self.keys.shape[-1] > SAMPLE:
            kept = self.keys.topk(SAMPLE, dim=-1, largest=False).indices
            self.sample, self.keys = self.sample.gather(-1, kept), self.keys.gather(-1, kept)

    def figures(self, head: int) -> dict:
        count = int(self.count[head])
        if count == 0:
            return {"values": 0}
        mean = float(self.total[head]) / count
        variance = max(float(self.squares[head]) / count - mean * mean, 0.0)
        sample = self.sample[head][self.keys[head] < math.inf]
        quantiles = torch.quantile(sample, torch.tensor(list(QUANTILES.values()), dtype=torch.float64))
        return {"values": count, "mean": mean, "std": math.sqrt(variance),
                **{name: float(value) for name, value in zip(QUANTILES, quantiles)}}


class Summary:
    """Statistic values of `heads` heads, added batch by batch, summarised per piece and layer."""

    def __init__(self, heads: int, seed: int = 0):
        self.heads = heads
        self._generator = torch.Generator().manual_seed(seed)
        # (statistic, piece, layer) -> (each head's cell, all heads' cell)
        self._cells: dict[tuple[str, str, int], tuple[_Cell, _Cell]] = {}

    def add(self, statistic: Statistic, piece: str, layer: int, values: Tensor) -> None:
        """`values` [h, R] of `statistic` on `piece` in `layer` (0-based; for a statistic between layers,
        the first of the two), NaN where a row has none."""
        key = (statistic.name, piece, layer)
        if key not in self._cells:
            self._cells[key] = (_Cell(self.heads), _Cell(1))
        per_head, pooled = self._cells[key]
        values = values.detach().to("cpu", torch.float64)
        per_head.add(values, self._generator)
        pooled.add(values.reshape(1, -1), self._generator)

    def as_json(self, statistics: tuple[Statistic, ...], not_applicable: dict[str, str]) -> dict:
        """{statistic name: {"applicable", "unit", "description", "pieces": {piece: [per layer, in
        order]}}} for `statistics`, each layer's entry its figures for all heads pooled then per head;
        those in `not_applicable` (name -> why) as {"applicable": false, "reason"}."""
        result = {}
        for statistic in statistics:
            if statistic.name in not_applicable:
                result[statistic.name] = {"applicable": False, "reason": not_applicable[statistic.name]}
                continue
            pieces: dict[str, list] = {}
            # (in the order added: pieces as collect reads them, layers in order)
            for (name, piece, layer), (per_head, pooled) in self._cells.items():
                if name != statistic.name:
                    continue
                place = {"layers": [layer + 1, layer + 2]} if statistic.between_layers else {"layer": layer + 1}
                heads = [{"head": head + 1, **per_head.figures(head)} for head in range(self.heads)]
                pieces.setdefault(piece, []).append({**place, **pooled.figures(0), "heads": heads})
            result[statistic.name] = {"applicable": True, "unit": statistic.unit,
                                      "description": statistic.description, "pieces": pieces}
        return result
