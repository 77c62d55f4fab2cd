"""longdoc.analyze.plots: a statistic whose piece has no value in any layer (a piece no query sees)
gets no per-head plot, and the others are still drawn."""

import pytest

from longdoc.analyze.plots import draw_all


def entry(layer: int, values: int) -> dict:
    figures = {"values": values}
    if values:
        figures.update(mean=0.5, std=0.1, p5=0.3, p25=0.4, p50=0.5, p75=0.6, p95=0.7)
    return {"layer": layer, **figures, "heads": [{"head": 1, **figures}]}


def test_a_piece_without_values_is_left_out_of_the_plots(tmp_path):
    pytest.importorskip("matplotlib")
    statistic = {"applicable": True, "unit": "fraction", "description": "",
                 "pieces": {"long": [entry(1, 5), entry(2, 5)], "g2g": [entry(1, 0), entry(2, 0)]}}
    analysis = {"model": {"path": "model"}, "statistics": {"normalized_entropy": statistic}}
    names = draw_all(analysis, tmp_path)
    assert names == ["overview.png", "normalized_entropy_long.png"]
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(names)
