"""The attention statistics of longdoc analyze, computed from the weights (and scores) the model keeps,
against the same statistics computed row by row from the dense float64 reference
(tests/model/dense_reference.py), which knows nothing of the blocked layout: per layer, head and piece,
the count of rows and the mean, for the eager backend in float64 and the C++ kernels in float32, with
residual attention on, off, under the running mean and with talking heads."""

import math

import pytest
import torch

from longdoc.analyze import STATISTIC_GROUPS
from longdoc.analyze.collect import add_batch
from longdoc.analyze.summary import BY_NAME, STATISTICS, TOP_FRACTIONS, Summary
from tests.model.backends.test_backends import model_on
from tests.model.conftest import make_inputs, tiny_config
from tests.model.dense_reference import DenseLayerAttention, dense_forward
from tests.model.test_attention import make_model

LENGTH, GLOBALS = 17, 6
TOLERANCE = {"eager": 1e-9, "cpu": 2e-5}
CONFIGS = {
    "residual": dict(residual_attention=True),
    "plain": dict(residual_attention=False),
    "running-mean": dict(residual_attention=True, residual_attention_mean=True),
    "talking-heads": dict(residual_attention=True, talking_heads=True),
}


def reference_values(record: list[DenseLayerAttention], inputs: dict, heads: int, residual: bool) -> dict:
    """{(statistic, piece, layer index): [per head: list of row values]} from the dense rows, one query
    at a time, over the keys it may attend to (the carried share with `residual` attention only)."""
    long_mask, global_mask = inputs["long_attention_mask"].bool(), inputs["global_attention_mask"].bool()
    values: dict = {}

    def add(name, piece, layer, head, value):
        if value is not None:
            values.setdefault((name, piece, layer), [[] for _ in range(heads)])[head].append(value)

    for layer, dense in enumerate(record):
        following = record[layer + 1] if layer + 1 < len(record) else None
        for example in range(long_mask.shape[0]):
            queries = [("long", i) for i in range(LENGTH) if long_mask[example, i]]
            queries += [("global", LENGTH + g) for g in range(GLOBALS) if global_mask[example, g]]
            for softmax, query in queries:
                allowed = dense.allowed[example, query]
                is_long_key = torch.arange(LENGTH + GLOBALS) < LENGTH
                pieces = {softmax: allowed}
                if softmax == "long":
                    pieces.update(l2l=allowed & is_long_key, l2g=allowed & ~is_long_key)
                else:
                    pieces.update(g2g=allowed & ~is_long_key, g2l=allowed & is_long_key)
                for head in range(heads):
                    row = dense.probs[example, head, query]
                    own = carried = None
                    if residual:
                        received = torch.zeros_like(row) if dense.carried is None else dense.carried[example, head, query]
                        own, carried = dense.summed[example, head, query] - received, received
                        own = torch.where(allowed, own - own[allowed].mean(), 0.0)
                        carried = torch.where(allowed, carried - carried[allowed].mean(), 0.0)
                    for piece, keys in pieces.items():
                        for name, value in row_statistics(row, keys, own, carried, piece == softmax).items():
                            add(name, piece, layer, head, value)
                        if following is not None:
                            add("js_divergence", piece, layer, head,
                                js(row[keys], following.probs[example, head, query][keys]))
    return values


def row_statistics(row: torch.Tensor, keys: torch.Tensor, own, carried, whole_row: bool) -> dict:
    seen = int(keys.sum())
    if seen == 0:
        return {}
    weights = row[keys]
    result = {"piece_weight": None if whole_row else float(weights.sum())}
    if weights.sum() > 0:
        p = weights / weights.sum()
        entropy = float(-(p[p > 0] * p[p > 0].log()).sum())
        result["entropy"] = entropy
        result["normalized_entropy"] = entropy / math.log(seen) if seen >= 2 else None
        ordered = p.sort(descending=True).values
        for name, fraction in TOP_FRACTIONS.items():
            result[name] = float(ordered[:max(1, math.ceil(fraction * seen))].sum())
    if own is not None:
        carried_size, own_size = float(carried[keys].abs().sum()), float(own[keys].abs().sum())
        result["carried_share"] = carried_size / (carried_size + own_size)
    return result


def js(first: torch.Tensor, second: torch.Tensor) -> float:
    p, q = first / first.sum(), second / second.sum()
    m = (p + q) / 2
    kl = lambda a: float((a[a > 0] * (a[a > 0] / m[a > 0]).log()).sum())
    return 0.5 * kl(p) + 0.5 * kl(q)


@pytest.mark.parametrize("backend", list(TOLERANCE))
@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
def test_statistics_equal_the_dense_references(backend, overrides):
    inputs = make_inputs(2, LENGTH, GLOBALS, padding=True, structure=True)
    model = model_on(backend, overrides)
    model.keep_attention_weights()
    heads = model.config.num_attention_heads
    summary = Summary(heads)
    with torch.no_grad():
        output = model(**inputs)
    add_batch(summary, output.attention_weights, inputs["long_attention_mask"], inputs["global_attention_mask"],
              frozenset(STATISTIC_GROUPS))
    record: list[DenseLayerAttention] = []
    with torch.no_grad():
        dense_forward(make_model(tiny_config(**overrides)), inputs, record)
    residual = overrides["residual_attention"]
    expected = reference_values(record, inputs, heads, residual)
    got = summary.as_json(STATISTICS, {} if residual else {"carried_share": "no residual attention"})
    assert got["carried_share"]["applicable"] is residual
    checked = set()
    for (name, piece, layer), per_head in expected.items():
        statistic = BY_NAME[name]
        entries = got[name]["pieces"][piece]
        entry = next(e for e in entries if e.get("layer", e.get("layers", [0])[0]) == layer + 1)
        for head, values in enumerate(per_head):
            figures = entry["heads"][head]
            assert figures["values"] == len(values), (name, piece, layer, head)
            if values:
                reference = torch.tensor(values, dtype=torch.float64)
                assert figures["mean"] == pytest.approx(float(reference.mean()), abs=TOLERANCE[backend]), \
                    (name, piece, layer, head)
                assert figures["p50"] == pytest.approx(float(reference.quantile(0.5)), abs=TOLERANCE[backend] * 10)
        checked.add((statistic.name, piece))
    # every statistic on every piece, carried share only with residual attention
    expected_names = {s.name for s in STATISTICS} - ({"carried_share"} if not residual else set())
    assert {name for name, _ in checked} == expected_names
    assert {piece for _, piece in checked} == {"long", "l2l", "l2g", "global", "g2g", "g2l"}
