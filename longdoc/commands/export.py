"""`longdoc export --model DIR --out DIR [--format onnx] [--opset N]`: a model folder as an ONNX
graph checked against the model at several lengths (longdoc.export)."""

import json
import sys
from pathlib import Path

from longdoc.errors import InputError

HELP = "export a model (task model, span reader, encoder) to ONNX, checked against PyTorch at several lengths"
FORMATS = ("onnx",)


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, type=Path, metavar="DIR",
                        help="a longdoc model folder: a trained task model, a lifted reader, a converted ETC "
                             "checkpoint or a lifted encoder")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR",
                        help="the folder to write (must not exist, or be empty): model.onnx beside the model, its "
                             "tokenizer, export.json and a README.md card")
    parser.add_argument("--format", choices=FORMATS, default="onnx", help="the export format (default onnx)")
    parser.add_argument("--opset", type=int, default=None, metavar="N",
                        help="the ONNX opset (default 18, what torch's exporter writes; older ones are converted "
                             "where every operator allows it)")
    parser.add_argument("--json", action="store_true", help="print export.json's record on stdout at the end")


def run(args) -> int:
    try:
        from longdoc.export.folder import export_folder
        from longdoc.tasks import REGISTRY
        from longdoc.export.graph import DEFAULT_OPSET
    except ImportError as error:
        raise InputError(f"longdoc export needs the onnx extra ({error.name} is not installed): "
                         'pip install "longdoc[onnx]"') from None
    opset = DEFAULT_OPSET if args.opset is None else args.opset
    report = (lambda text: print(f"longdoc export: {text}", file=sys.stderr)) if args.progress else None
    card = export_folder(args.model, args.out, REGISTRY, opset, progress=report)
    differences = ", ".join(f"{name} {value:.2g}" for name, value in card["max_difference"].items())
    lengths = ", ".join(str(length) for length in sorted({check["length"] for check in card["checks"]}))
    print(f"wrote {args.out}: {card['model']} in ONNX opset {card['opset']}, checked at {lengths} long tokens "
          f"(largest differences: {differences})", file=sys.stderr)
    if args.json:
        print(json.dumps(card))
    return 0
