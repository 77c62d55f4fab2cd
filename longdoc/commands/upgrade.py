"""`longdoc upgrade DIR`: a model folder written with the attention's old parameter names rewritten
under the current ones (longdoc.convert.upgrade), once; loading it before is refused naming this command."""

import argparse
from pathlib import Path

HELP = "rename the old attention parameter names in a model folder's weights (its checkpoints too), once"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", type=Path, metavar="DIR", help="the model or run folder, rewritten in place")


def run(args: argparse.Namespace) -> int:
    from longdoc.convert.upgrade import upgrade_model_folder

    upgraded = upgrade_model_folder(args.folder)
    for path, count in upgraded.items():
        print(f"{path}: {count} tensors renamed")
    if not upgraded:
        print(f"{args.folder}: already under the current names; nothing rewritten")
    return 0
