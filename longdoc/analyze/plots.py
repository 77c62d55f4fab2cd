"""PNG plots of an analysis, drawn from analysis.json's figures alone (matplotlib, the `analyze` extra).

- overview.png: per statistic, the mean per layer (or pair of adjacent layers) of each piece;
- STATISTIC_PIECE.png for the normalised entropy, the weight on the top 10% of keys, the
  Jensen-Shannon divergence between adjacent layers and the carried share: one panel per layer, one box
  per head (the median, the quartiles and whiskers at the 5th and 95th percentiles), heads ordered by
  their median in each panel, as RealFormer's figures 4 and 5 draw them.

Figures are built with matplotlib's object interface (no pyplot): nothing global changes.
"""

import math
from pathlib import Path

PLOTTED = ("normalized_entropy", "top_10pct", "js_divergence", "carried_share")
PIECE_COLOURS = {"long": "#1f77b4", "l2l": "#6baed6", "l2g": "#08519c", "global": "#d62728", "g2g": "#fc9272",
                 "g2l": "#a50f15"}
PANELS_PER_ROW = 4
INSTALL_HINT = 'the plots need matplotlib: pip install -e ".[analyze]" (or pass --no-plots)'


def plotting_available() -> bool:
    from importlib.util import find_spec

    return find_spec("matplotlib") is not None


def _where(entry: dict) -> str:
    return f"layer {entry['layer']}" if "layer" in entry else f"layers {entry['layers'][0]}-{entry['layers'][1]}"


def _position(entry: dict) -> float:
    return entry["layer"] if "layer" in entry else (entry["layers"][0] + entry["layers"][1]) / 2


def _save(figure, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    figure.savefig(path, dpi=110)


def draw_overview(analysis: dict, folder: Path) -> str | None:
    """overview.png (None when no plotted statistic applies)."""
    from matplotlib.figure import Figure

    shown = [name for name in PLOTTED if analysis["statistics"].get(name, {}).get("applicable")]
    if not shown:
        return None
    columns = min(len(shown), 2)
    rows = math.ceil(len(shown) / columns)
    figure = Figure(figsize=(5.5 * columns, 3.8 * rows), layout="constrained")
    panels = figure.subplots(rows, columns, squeeze=False).ravel()
    for axes in panels[len(shown):]:
        axes.set_visible(False)
    for axes, name in zip(panels, shown):
        statistic = analysis["statistics"][name]
        for piece, entries in statistic["pieces"].items():
            entries = [entry for entry in entries if entry["values"]]
            axes.plot([_position(entry) for entry in entries], [entry["mean"] for entry in entries], marker="o",
                      label=piece, color=PIECE_COLOURS.get(piece), linewidth=2.2 if piece in ("long", "global") else 1)
        axes.set_title(name.replace("_", " "))
        axes.set_xlabel("layer" if statistic["pieces"] and "layer" in next(iter(statistic["pieces"].values()))[0]
                        else "between layers")
        axes.xaxis.get_major_locator().set_params(integer=True)
        axes.set_ylabel(statistic["unit"])
        axes.legend(fontsize="small")
    figure.suptitle(f"{analysis['model']['path']}: mean over heads and queries")
    _save(figure, folder / "overview.png")
    return "overview.png"


def draw_per_head(analysis: dict, name: str, piece: str, folder: Path) -> str | None:
    """NAME_PIECE.png: a panel per layer, a box per head (None when no layer has a value: a piece no
    query sees, as g2l's keys under hard g2l with no long token in a global's sentence)."""
    from matplotlib.figure import Figure

    statistic = analysis["statistics"][name]
    entries = [entry for entry in statistic["pieces"][piece] if entry["values"]]
    if not entries:
        return None
    rows = math.ceil(len(entries) / PANELS_PER_ROW)
    columns = min(len(entries), PANELS_PER_ROW)
    figure = Figure(figsize=(3.6 * columns, 2.8 * rows), layout="constrained")
    panels = figure.subplots(rows, columns, squeeze=False, sharey=True).ravel()
    for axes, entry in zip(panels, entries):
        heads = sorted((head for head in entry["heads"] if head["values"]), key=lambda head: head["p50"])
        boxes = [{"med": head["p50"], "q1": head["p25"], "q3": head["p75"], "whislo": head["p5"],
                  "whishi": head["p95"], "label": str(head["head"]), "fliers": []} for head in heads]
        axes.bxp(boxes, showfliers=False)
        axes.set_title(_where(entry), fontsize="medium")
        axes.set_xlabel("head", fontsize="small")
        axes.tick_params(axis="x", labelsize="x-small")
    for axes in panels[len(entries):]:
        axes.set_visible(False)
    figure.suptitle(f"{name.replace('_', ' ')} ({statistic['unit']}), {piece}: per head (ordered by median)")
    file_name = f"{name}_{piece}.png"
    _save(figure, folder / file_name)
    return file_name


def draw_all(analysis: dict, folder: Path) -> list[str]:
    """Every plot of `analysis` into `folder`; their file names."""
    names = [draw_overview(analysis, folder)]
    for name in PLOTTED:
        statistic = analysis["statistics"].get(name, {})
        if statistic.get("applicable"):
            names.extend(draw_per_head(analysis, name, piece, folder) for piece in statistic["pieces"])
    return [name for name in names if name is not None]
