"""`longdoc serve DOCS... [--model DIR]`, `longdoc serve --task TASK --gold FILE --pred FILE...` and
`longdoc serve --analysis DIR`: a local web page and HTTP API to ask documents, to browse a model's
predictions beside the gold, or to show an attention analysis (longdoc.serve). Loopback by default;
prints the address, serves until Ctrl-C."""

import argparse
import sys
from importlib.util import find_spec
from pathlib import Path

from longdoc.cpu_memory import uncache_onednn_primitives
from longdoc.model import inference
from longdoc.commands.model_flags import add_placement_arguments
from longdoc.commands.evaluate import add_metric_arguments, task_metric_options
from longdoc.commands.documents import tell_unreadable
from longdoc.commands.hints import require_reader_folder
from longdoc.errors import InputError
from longdoc.tasks import REGISTRY

HELP = "a local web page and HTTP API: ask your documents, browse predictions beside the gold, or show an analysis"
INSTALL_HINT = 'longdoc serve needs the serve extra: pip install -e ".[serve]" (FastAPI and uvicorn)'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="*", metavar="DOCS", help="documents to ask (files and folders, as `longdoc "
                                                                 "ask` reads them)")
    parser.add_argument("--model", type=Path, metavar="DIR",
                        help="the reader, as `longdoc ask --model` takes it; without it, answers are sentences")
    browse = parser.add_argument_group("prediction browser (instead of DOCS)")
    names = REGISTRY.names()
    browse.add_argument("--task", choices=names, metavar="TASK", help=f"one of: {', '.join(names)}")
    browse.add_argument("--gold", type=Path, metavar="FILE", help="the official gold (dev) file")
    browse.add_argument("--pred", type=Path, action="append", default=[], metavar="FILE",
                        help="a prediction file in the official format; twice to compare two runs side by side")
    browse.add_argument("--runs", nargs="+", default=[], metavar="DIR",
                        help="run folders (their metrics.json): the page shows their leaderboard, each run that "
                             "records a prediction file on this gold one click away")
    add_metric_arguments(browse)
    parser.add_argument("--analysis", type=Path, metavar="DIR",
                        help="instead of DOCS or --task: show the attention analysis in DIR (the --out of `longdoc "
                             "analyze attention`)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=_port, default=8000, help="port (default 8000; 0: any free port)")
    add_placement_arguments(parser)  # the reader's; the MiniLM retriever runs on the CPU


def _port(text: str) -> int:
    """--port's value: a TCP port, or 0 for any free one (the socket layer would take 99999 modulo 65536)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is outside 1-65535 (0: any free port)")
    return port


def _check_mode(args) -> None:
    if args.analysis is not None:
        stray = [flag for flag, value in (("DOCS", args.paths), ("--model", args.model), ("--task", args.task),
                                          ("--gold", args.gold), ("--pred", args.pred), ("--runs", args.runs)) if value]
        if stray:
            raise InputError(f"--analysis shows an analysis alone: leave out {', '.join(stray)}")
        return
    if args.task is None:
        if not args.paths:
            raise InputError("give documents to ask (longdoc serve DOCS...), or --task TASK --gold FILE --pred FILE "
                             "to browse predictions")
        stray = [flag for flag, value in (("--gold", args.gold), ("--pred", args.pred), ("--runs", args.runs)) if value]
        if stray:
            raise InputError(f"{', '.join(stray)} belong to the prediction browser: give --task TASK too")
        return
    if args.paths or args.model is not None:
        raise InputError("either documents to ask (DOCS, --model) or a prediction browser (--task), not both")
    if args.gold is None or not (args.pred or args.runs):
        raise InputError(f"--task {args.task} needs --gold FILE and --pred FILE (or --runs DIR)")


def _ask_service(args):
    from longdoc.model.encoder_folder import describe_checkpoint
    from longdoc.ask.session import ReaderPlacement
    from longdoc.ask.documents import load_sources
    from longdoc.serve.asking import AskService

    if args.model is not None:  # a wrong folder is told before anything is served
        require_reader_folder(args.model)
        describe_checkpoint(args.model)
    device, dtype = inference.resolve_placement(args.device, args.dtype)
    sources, errors = load_sources(args.paths)
    tell_unreadable("serve", errors, len(sources), "serving")
    if not sources:
        raise InputError("no readable document to serve")
    return AskService(sources, args.model, placement=ReaderPlacement(device, dtype, args.attention), tasks=REGISTRY,
                      named_by=args.paths)


def run(args) -> int:
    uncache_onednn_primitives()  # texts of every length: a shape a batch (longdoc/cpu_memory.py)
    if find_spec("fastapi") is None or find_spec("uvicorn") is None:
        raise InputError(INSTALL_HINT)
    from longdoc.serve.analysis import AnalysisFolder
    from longdoc.serve.app import create_app
    from longdoc.serve.browser import PredictionBrowser
    from longdoc.serve.server import allowed_hosts, is_loopback, listen
    from longdoc.serve.server import run as serve

    _check_mode(args)
    listener = listen(args.host, args.port)  # a port in use is told before minutes of indexing
    service = browser = analysis = None
    if args.analysis is not None:
        analysis = AnalysisFolder(args.analysis)
        served = "analysis figures"
    elif args.task is None:
        service = _ask_service(args)
        served = "documents"
    else:
        browser = PredictionBrowser(REGISTRY, args.task, args.gold, args.pred, task_metric_options(args), args.runs,
                                    allow_missing=args.allow_missing)
        served = "gold and prediction files"
    app = create_app(asking=service, browser=browser, analysis=analysis, allowed_hosts=allowed_hosts(args.host))
    if not is_loopback(args.host):
        print(f"longdoc serve: warning: listening on {args.host}, not loopback: the {served} become readable from "
              "the network", file=sys.stderr)
    print(f"longdoc serve: {listener.url}  (Ctrl-C to stop)", flush=True)
    try:
        serve(app, listener, log_level="warning" if args.progress else "error")
    finally:
        if service is not None:
            service.close()
    print("longdoc serve: stopped", file=sys.stderr)
    return 0
