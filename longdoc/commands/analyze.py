"""`longdoc analyze attention --model DIR --data FILE [--task TASK] [--examples N] --out DIR`: a model's
attention measured on its own weights (longdoc.analyze), written as OUT/analysis.json and PNG plots,
with a per-layer table on stdout."""

import json
import sys
from pathlib import Path

from longdoc.commands.model_flags import add_placement_arguments
from longdoc.analyze import ANALYSIS_FILE, STATISTIC_GROUPS
from longdoc.tasks import REGISTRY

HELP = ("measure a model's attention per layer, head and piece: entropy, sparsity, change between layers, "
        "carried share (analysis.json and PNG plots)")
# The columns of the table printed on stdout: (statistic, piece, heading).
TABLE = (("normalized_entropy", "long", "H/log n long"), ("normalized_entropy", "global", "H/log n global"),
         ("top_10pct", "long", "top10% long"), ("js_divergence", "long", "JS->next long"),
         ("carried_share", "long", "carried long"))


def add_arguments(parser) -> None:
    parser.add_argument("what", metavar="WHAT", choices=("attention",), help="what to analyse: attention")
    parser.add_argument("--model", required=True, type=Path, metavar="DIR",
                        help="a longdoc model folder: an encoder (lifted, converted, pretrained), a trained task "
                             "model or a lifted reader (its encoder is analysed)")
    parser.add_argument("--data", required=True, type=Path, metavar="FILE",
                        help="with --task, a file of that task in its official format; without, plain text (a file "
                             "or a folder of them), packed as pretraining packs it, one global token per sentence")
    names = REGISTRY.names()
    # (no argparse choices: an unknown name is refused in one line, as every other bad input)
    parser.add_argument("--task", metavar="TASK",
                        help=f"the task whose features the model reads --data as: one of {', '.join(names)}")
    parser.add_argument("--examples", type=int, default=64, metavar="N",
                        help="model inputs to analyse: the first N windows of --data (default 64)")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR",
                        help="folder to create (must not exist, or be empty): analysis.json and the PNG plots")
    parser.add_argument("--batch-size", type=int, default=4, metavar="N", help="inputs per forward pass (default 4)")
    parser.add_argument("--statistics", default=",".join(STATISTIC_GROUPS), metavar="LIST",
                        help=f"comma-separated, among {', '.join(STATISTIC_GROUPS)} (default: all; carried-share only where "
                             "the model has residual attention, reported as not applicable otherwise)")
    parser.add_argument("--no-plots", dest="plots", action="store_false",
                        help="write analysis.json only (the plots need matplotlib: the analyze extra)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object on stdout instead of the table: the folder, its files, the model "
                             "and the data")
    add_placement_arguments(parser)


def _value(analysis: dict, statistic: str, piece: str, layer: int) -> str:
    found = analysis["statistics"].get(statistic)
    if found is None:
        return "-"
    if not found["applicable"]:
        return "n/a"
    for entry in found["pieces"].get(piece, []):
        if entry.get("layer", (entry.get("layers") or [None])[0]) == layer and entry["values"]:
            return f"{entry['mean']:.3f}"
    return "-"


def table(analysis: dict) -> str:
    """The mean per layer of a few statistics (all heads and queries pooled)."""
    headings = ["layer", *(heading for _, _, heading in TABLE)]
    lines = ["  ".join(f"{heading:>15}" for heading in headings)]
    for layer in range(1, analysis["model"]["layers"] + 1):
        cells = [str(layer), *(_value(analysis, statistic, piece, layer) for statistic, piece, _ in TABLE)]
        lines.append("  ".join(f"{cell:>15}" for cell in cells))
    return "\n".join(lines)


def run(args) -> int:
    from longdoc.analyze.run import AnalysisOptions, analyze_attention

    statistics = tuple(name.strip() for name in args.statistics.split(",") if name.strip())
    options = AnalysisOptions(model=args.model, data=args.data, out=args.out, task=args.task, examples=args.examples,
                              batch_size=args.batch_size, statistics=statistics, device=args.device, dtype=args.dtype,
                              attention=args.attention, plots=args.plots, progress=args.progress)
    result = analyze_attention(options, REGISTRY)
    analysis = result.analysis
    carried = analysis["statistics"].get("carried_share", {})
    if not carried.get("applicable", True):
        print(f"longdoc analyze: carried share not applicable: {carried['reason']}", file=sys.stderr)
    if args.json:
        print(json.dumps({"out": str(result.out), "analysis": str(result.out / ANALYSIS_FILE),
                          "plots": [str(result.out / name) for name in analysis["plots"]],
                          "model": analysis["model"], "data": analysis["data"]}))
    else:
        print(table(analysis))
    print(f"longdoc analyze: {analysis['data']['inputs']} inputs ({analysis['data']['long_tokens']} long and "
          f"{analysis['data']['global_tokens']} global tokens) -> {result.out / ANALYSIS_FILE} and "
          f"{len(analysis['plots'])} plots", file=sys.stderr)
    return 0
