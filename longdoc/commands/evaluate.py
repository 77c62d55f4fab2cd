"""`longdoc evaluate TASK --gold FILE --pred FILE [--json]`: a task's official metric on its official files."""

import json
import sys
from pathlib import Path

from longdoc.errors import InputError
from longdoc.evaluate.tables import markdown_table
from longdoc.tasks import REGISTRY

HELP = "score an official prediction file against its gold file with the task's official metric"

# The official NQ evaluation's default: a gold answer exists when at least 2 of 5 annotators gave one.
NQ_DEFAULT_NON_NULL_THRESHOLD = 2
_NQ_OPTIONS = ("long_non_null_threshold", "short_non_null_threshold")


def add_arguments(parser) -> None:
    parser.add_argument("task", metavar="TASK", choices=list(REGISTRY), help=f"one of: {', '.join(REGISTRY)}")
    parser.add_argument("--gold", required=True, type=Path, help="the official gold (dev) file")
    parser.add_argument("--pred", required=True, type=Path, help="the prediction file, in the official format")
    parser.add_argument("--json", action="store_true", help="print one JSON object with the official key names")
    parser.add_argument("--long-non-null-threshold", type=int, metavar="N",
                        help=f"nq only: annotators needed for a gold long answer (default {NQ_DEFAULT_NON_NULL_THRESHOLD})")
    parser.add_argument("--short-non-null-threshold", type=int, metavar="N",
                        help=f"nq only: annotators needed for a gold short answer (default {NQ_DEFAULT_NON_NULL_THRESHOLD})")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="also write DIR/metrics.json, for `longdoc leaderboard`")
    parser.add_argument("--split", help="split name recorded in metrics.json (with --out)")
    parser.add_argument("--model", help="model name recorded in metrics.json (with --out)")


def _task_options(args) -> dict[str, int]:
    given = {name: getattr(args, name) for name in _NQ_OPTIONS if getattr(args, name) is not None}
    if args.task != "nq":
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            raise InputError(f"{flags} applies to the nq task only, not {args.task}")
        return {}
    return {name: given.get(name, NQ_DEFAULT_NON_NULL_THRESHOLD) for name in _NQ_OPTIONS}


def run(args) -> int:
    from longdoc.evaluate.leaderboard import task_metric, write_metrics_json

    options = _task_options(args)
    if (args.split or args.model) and not args.out:
        raise InputError("--split and --model are recorded in metrics.json: give --out DIR too")
    metrics = task_metric(args.task).evaluate_files(args.gold, args.pred, **options)
    if args.json:
        print(json.dumps(metrics))
    else:
        # repr: the shortest text that reads back as the same float, so nothing is rounded away.
        print(markdown_table(["metric", "value"], [[key, repr(value)] for key, value in metrics.items()]))
    if args.out:
        config = {"gold": str(args.gold.resolve()), "pred": str(args.pred.resolve()), **options}
        path = write_metrics_json(args.out, task=args.task, split=args.split, model=args.model, config=config,
                                  metrics=metrics)
        print(f"wrote {path}", file=sys.stderr)
    return 0
