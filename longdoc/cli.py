"""The `longdoc` command: one subcommand per module under longdoc/commands.

Each command module defines `HELP` (one line), `add_arguments(parser)` and `run(args) -> int`;
they parse arguments and call library functions, nothing more. Heavy imports (torch, transformers)
happen inside `run`, so `longdoc --help` stays fast.
"""

import argparse
import importlib
import sys
import warnings

from longdoc.commands.hints import with_hint
from longdoc.cpu_memory import configure_allocator
from longdoc.errors import InputError

COMMANDS = {
    "evaluate": "longdoc.commands.evaluate",
    "leaderboard": "longdoc.commands.leaderboard",
    "bench": "longdoc.commands.bench",
    "lift": "longdoc.commands.lift",
    "convert": "longdoc.commands.convert",
    "make-data": "longdoc.commands.make_data",
    "ask": "longdoc.commands.ask",
    "predict": "longdoc.commands.predict",
    "train": "longdoc.commands.train",
    "pretrain": "longdoc.commands.pretrain",
    "demo": "longdoc.commands.demo",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="longdoc", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        sub = subparsers.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def _format_warning(message, category, filename, lineno, line=None) -> str:
    # Warnings from the library are messages for the user (counts of dropped or missing items),
    # not for a developer: no file names or source lines.
    return f"longdoc: warning: {message}\n"


def main(argv=None) -> int:
    warnings.formatwarning = _format_warning
    configure_allocator()  # freed memory kept for every command (longdoc/cpu_memory.py)
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (InputError, FileNotFoundError, IsADirectoryError) as error:
        print(f"longdoc {args.command}: error: {with_hint(error)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
