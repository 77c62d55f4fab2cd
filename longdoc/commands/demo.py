"""`longdoc demo [--out DIR]`: the README's main job (longdoc.demo) on the registry's multihop task:
generate the built-in multi-hop data, train the lifted MiniLM on whole documents and on their first
512 tokens, print the leaderboard of the two held-out runs, then ask the trained model one question
as `longdoc ask` does (its own options and printing, not a second command line)."""

import argparse
import shlex
import sys
import time
from pathlib import Path

from longdoc.commands import INTERRUPTED_STATUS
from longdoc.demo import CONFIG_NAME, DemoData, default_model_dir, default_out, run_demo
from longdoc.errors import InputError

HELP = "the main job: train on generated long multi-hop documents and compare with the first 512 tokens only"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = DemoData()
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="data, both runs (models, checkpoints) and their metrics.json (default: "
                             "~/.cache/longdoc/demo, under $LONGDOC_CACHE when set); a rerun resumes")
    parser.add_argument("--config", default=CONFIG_NAME, metavar="FILE|NAME",
                        help=f"training options of both runs (default: the multihop task's {CONFIG_NAME!r} config)")
    parser.add_argument("--max-steps", type=int, metavar="N", help="optimizer steps of each run (default: the config's)")
    for name, help_text in (("train_examples", "generated training examples"),
                            ("dev_examples", "generated held-out examples"),
                            ("length", "wordpieces per document"),
                            ("min_distance", "fewest wordpieces between the two facts of a question"),
                            ("restricted_length", "wordpieces the restricted model reads")):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(defaults, name), metavar="N",
                            help=f"{help_text} (default {getattr(defaults, name)})")
    parser.add_argument("--seed", type=int, default=defaults.seed, help=f"data seed (default {defaults.seed})")
    parser.add_argument("--model-dir", type=Path, metavar="DIR",
                        help="where the whole-document model is copied for `longdoc ask --model` (default: "
                             "~/.cache/longdoc/models/multihop, under $LONGDOC_CACHE when set)")


def _ask(words: list[str], progress: bool) -> int:
    """`longdoc ask WORDS` through the ask command's own options (their defaults) and run."""
    from longdoc.commands import ask

    parser = argparse.ArgumentParser(prog="longdoc ask")
    ask.add_arguments(parser)
    args = parser.parse_args(words)
    args.progress = progress
    return ask.run(args)


def run(args: argparse.Namespace) -> int:
    from longdoc.tasks import REGISTRY

    if args.max_steps is not None and args.max_steps < 1:
        raise InputError(f"--max-steps must be >= 1, got {args.max_steps}")
    data = DemoData(train_examples=args.train_examples, dev_examples=args.dev_examples, length=args.length,
                    min_distance=args.min_distance, restricted_length=args.restricted_length, seed=args.seed)
    started = time.perf_counter()
    overrides = {"max_steps": args.max_steps} if args.max_steps is not None else {}
    model_dir = args.model_dir or default_model_dir()
    out = args.out or default_out()
    print(f"longdoc demo: writing the data and both runs to {out}", file=sys.stderr)
    try:
        result = run_demo(REGISTRY, out, data, overrides, args.config, model_dir)
    except KeyboardInterrupt:
        print("longdoc demo: stopped; rerun the same command to resume", file=sys.stderr)
        return INTERRUPTED_STATUS
    print(result.leaderboard)
    print()
    for name, metrics in result.metrics.items():
        print(f"held-out answer F1, {name}: {metrics.get('f1', float('nan')):.4f}")
    # One question to a long generated document, answered with its location by the model just trained.
    ask = ["--model", str(model_dir), "--question", result.question, str(result.document)]
    print(f"\n$ longdoc ask {' '.join(shlex.quote(word) for word in ask)}", flush=True)
    status = _ask(ask, args.progress)
    print(f"longdoc demo: {time.perf_counter() - started:.0f} s in all; runs in {out}", file=sys.stderr)
    return status
