"""The `longdoc` command.

Each command module (longdoc/commands) defines `HELP` (one line), `add_arguments(parser)` and
`run(args) -> int`; they parse arguments and call library functions, nothing more. Heavy imports
(torch, transformers) happen inside `run`, so `longdoc --help` stays fast.
"""

import argparse
import difflib
import importlib
import os
import sys
import time
import warnings
from importlib.metadata import version

from longdoc.commands import INTERRUPTED_STATUS
from longdoc.commands.hints import as_flags, with_hint
from longdoc.model.cpu_blas import configure_blas, configure_capability
from longdoc.cpu_memory import configure_allocator
from longdoc.errors import InputError, OptionWarning
from longdoc.io import atomic_write_json

DESCRIPTION = """\
longdoc answers questions over long documents: ask a question of your own files (with the
answer's exact place in them), train and run question-answering models on WikiHop, HotpotQA,
Natural Questions and OpenKP, score predictions with each dataset's official metric and rank the
runs beside the published figures."""

EPILOG = "Run `longdoc COMMAND --help` for a command's options; `longdoc demo` runs the main job end to end."

COMMANDS = {
    "evaluate": "longdoc.commands.evaluate",
    "leaderboard": "longdoc.commands.leaderboard",
    "bench": "longdoc.commands.bench",
    "lift": "longdoc.commands.lift",
    "convert": "longdoc.commands.convert",
    "upgrade": "longdoc.commands.upgrade",
    "make-data": "longdoc.commands.make_data",
    "ask": "longdoc.commands.ask",
    "index": "longdoc.commands.index",
    "serve": "longdoc.commands.serve",
    "predict": "longdoc.commands.predict",
    "export": "longdoc.commands.export",
    "train": "longdoc.commands.train",
    "pretrain": "longdoc.commands.pretrain",
    "demo": "longdoc.commands.demo",
    "analyze": "longdoc.commands.analyze",
}

# Commands that never import transformers: its output settings are left unloaded for them.
WITHOUT_TRANSFORMERS = {"evaluate", "leaderboard"}

# The exit status of a program ended by SIGPIPE (128 + 13), as `cat` or `grep` report when the
# reader closes the pipe early: `set -o pipefail` treats longdoc as it treats them.
BROKEN_PIPE_STATUS = 141

# What a command stopped by Ctrl-C leaves behind, where it is known: every file these commands write
# appears whole or not at all. (train and pretrain say it themselves: the checkpoint they saved.)
KEPT_WHEN_INTERRUPTED = {
    **dict.fromkeys(("predict", "export", "lift", "convert", "evaluate", "analyze", "make-data", "bench",
                     "leaderboard"), "nothing written"),
    "ask": "the documents indexed so far are kept in the index cache; asking again starts from them",
}


def _add_output_options(parser: argparse.ArgumentParser, default) -> None:
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--quiet", action="store_true", default=default,
                        help="also hide longdoc's warnings and progress bars (by default transformers' log "
                             "messages and weight-loading progress bars are hidden, longdoc's own shown)")
    output.add_argument("--verbose", action="store_true", default=default,
                        help="also show transformers' log messages and weight-loading progress bars")


class _Parser(argparse.ArgumentParser):
    """The top-level parser: arguments no command takes are refused with that command's usage, and a
    misspelled flag with the nearest one the command has (argparse suggests flags only from Python 3.14)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.command_parsers: dict[str, argparse.ArgumentParser] = {}

    def parse_args(self, args=None, namespace=None):
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            command_parser = self.command_parsers.get(getattr(parsed, "command", None), self)
            command_parser.error(_unrecognized(unknown, command_parser))
        return parsed


def _unrecognized(unknown: list[str], parser: argparse.ArgumentParser) -> str:
    """argparse's message for arguments no option takes, and the nearest flag to each misspelled one."""
    flags = [flag for action in parser._actions for flag in action.option_strings]
    nearest = [match for argument in unknown if argument.startswith("--")
               for match in difflib.get_close_matches(argument.split("=", 1)[0], flags, n=1)]
    message = f"unrecognized arguments: {' '.join(unknown)}"
    return message + (f"; did you mean {' or '.join(dict.fromkeys(nearest))}?" if nearest else "")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="longdoc", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"longdoc {version('longdoc')}")
    _add_output_options(parser, default=False)
    # --quiet / --verbose also after the command (`longdoc ask ... --quiet`), where users put flags;
    # there they default to nothing, so that one given before the command stands.
    after_command = argparse.ArgumentParser(add_help=False)
    _add_output_options(after_command, default=argparse.SUPPRESS)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        # A command with OWN_HELP adds its own -h/--help (`longdoc train TASK --help`: that task's options).
        sub = subparsers.add_parser(name, help=module.HELP, description=module.HELP, parents=[after_command],
                                    add_help=not getattr(module, "OWN_HELP", False))
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
        parser.command_parsers[name] = sub
    return parser


def _format_warning(message, category, filename, lineno, line=None) -> str:
    # Warnings from the library are messages for the user (counts of dropped or missing items),
    # not for a developer: no file names or source lines; options named by their flags.
    return f"longdoc: warning: {as_flags(message) if isinstance(message, OptionWarning) else message}\n"


def _configure_output(args) -> None:
    """What this process prints besides results: set here, by the program, never by a library import.
    `args.progress` is what commands pass on as the `progress=` of longdoc's own progress bars."""
    args.progress = not args.quiet
    warnings.formatwarning = _format_warning
    if args.quiet:
        warnings.simplefilter("ignore")
    if args.command in WITHOUT_TRANSFORMERS:
        return
    if "transformers" not in sys.modules and "huggingface_hub" not in sys.modules:
        # Set as the variables both read when first imported: a command that turns out not to need
        # transformers (ask without a reader) does not import it (about half a second) only to set it.
        os.environ["TRANSFORMERS_VERBOSITY"] = "info" if args.verbose else "error"
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "0" if args.verbose else "1"
        return
    from transformers.utils import logging as transformers_logging

    if args.verbose:
        transformers_logging.set_verbosity_info()
        transformers_logging.enable_progress_bar()
    else:
        transformers_logging.set_verbosity_error()
        transformers_logging.disable_progress_bar()


def _silence_closed_stdout() -> None:
    # Python's advice (signal module docs, "Note on SIGPIPE"): point stdout at devnull, so that the
    # flush at exit does not raise a second BrokenPipeError.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main(argv=None) -> int:
    configure_allocator()  # freed memory kept for every command (longdoc/cpu_memory.py)
    configure_blas()  # MKL_CBWR, before the first product: MKL's products reproducible (longdoc/model/cpu_blas.py)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quiet and args.verbose:  # one before the command, the other after it
        parser.error("argument --quiet: not allowed with argument --verbose")
    try:
        _configure_output(args)  # inside: importing transformers takes seconds, Ctrl-C may come then
        configure_capability()  # before torch's first operation, which reads ATEN_CPU_CAPABILITY
        status = args.run(args)
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        # The reader stopped reading (`longdoc leaderboard --json | head`): end quietly.
        _silence_closed_stdout()
        return BROKEN_PIPE_STATUS
    except KeyboardInterrupt:
        kept = KEPT_WHEN_INTERRUPTED.get(args.command)
        print(f"longdoc {args.command}: interrupted" + (f"; {kept}" if kept else ""), file=sys.stderr)
        return INTERRUPTED_STATUS
    except (InputError, FileNotFoundError, IsADirectoryError) as error:
        message = f"longdoc {args.command}: error: {_said(error)}"
        print(message, file=sys.stderr)
        _tell_torchrun(message)
        return 2


def _said(error: Exception) -> str:
    """The error in the words every command uses: a missing path as "PATH: no such file or folder",
    not Python's "[Errno 2] No such file or directory: 'PATH'"."""
    if isinstance(error, OSError) and error.filename is not None:
        reason = "no such file or folder" if isinstance(error, FileNotFoundError) else "a folder, not a file"
        return f"{error.filename}: {reason}"
    return with_hint(error)


def _tell_torchrun(message: str) -> None:
    """In a process torchrun started, the error also goes into the file torchrun reads when one of its
    processes fails, so that its closing summary names the error (without it: "To enable traceback
    see ..."). The file's simple form, which torchrun's ProcessFailure reads: a message and a time."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        try:
            atomic_write_json(error_file, {"message": message, "timestamp": int(time.time())})
        except OSError:
            pass  # the error is printed already; torchrun's summary then says less, as without the file


if __name__ == "__main__":
    sys.exit(main())
