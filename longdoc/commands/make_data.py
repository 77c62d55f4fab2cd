"""`longdoc make-data TASK --n N --length TOKENS --seed S --out FILE`: write a generated task's data file."""

import argparse
import importlib
import json
import sys

from longdoc.tasks import get_task, task_names

HELP = "generate a built-in task's examples (multihop: long documents in the HotpotQA format)"


def _generated_tasks() -> list[str]:
    return [name for name in task_names() if "generator" in get_task(name).extras]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    names = _generated_tasks()
    parser.add_argument("task", metavar="TASK", choices=names, help=f"one of: {', '.join(names)}")
    parser.add_argument("--n", type=int, required=True, help="number of examples")
    parser.add_argument("--length", type=int, required=True, metavar="TOKENS",
                        help="wordpieces per example, question and [CLS]/[SEP] included (MiniLM's tokenizer)")
    parser.add_argument("--seed", type=int, required=True, help="the same seed writes the same file")
    parser.add_argument("--out", required=True, metavar="FILE", help="the JSON file to write")
    parser.add_argument("--min-distance", type=int, metavar="TOKENS",
                        help="fewest wordpieces between the two facts of a question (default: half of --length)")
    parser.add_argument("--comparison-fraction", type=float, default=0.2,
                        help="share of yes/no comparison questions; the rest are bridge questions (default: 0.2)")
    parser.add_argument("--relation-share", type=float, default=0.35,
                        help="share of distractor sentences stating a relation about other entities; 0: none, the "
                             "facts are the only relation sentences (default: 0.35)")
    parser.add_argument("--chain-order", action="store_true",
                        help="the two facts in the order of the chain, so a bridge answer always lies past "
                             "--min-distance (default: random order)")
    parser.add_argument("--json", action="store_true",
                        help="print what was written as one JSON object on stdout (path, examples, options)")


def run(args: argparse.Namespace) -> int:
    generator = importlib.import_module(get_task(args.task).extras["generator"])
    path = generator.write_examples(args.out, args.n, seed=args.seed, length=args.length,
                                    min_distance=args.min_distance, comparison_fraction=args.comparison_fraction,
                                    relation_share=args.relation_share, chain_order=args.chain_order,
                                    progress=args.progress)
    if args.json:
        summary = {"task": args.task, "path": str(path), "examples": args.n, "bytes": path.stat().st_size,
                   "length": args.length, "seed": args.seed,
                   # None is the generator's default, half of --length (see --min-distance's help)
                   "min_distance": args.length // 2 if args.min_distance is None else args.min_distance,
                   "comparison_fraction": args.comparison_fraction, "relation_share": args.relation_share,
                   "chain_order": args.chain_order}
        print(json.dumps(summary, ensure_ascii=False))
    else:
        print(f"wrote {args.n} {args.task} examples to {path}", file=sys.stderr)
    return 0
