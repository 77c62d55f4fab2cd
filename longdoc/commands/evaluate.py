"""`longdoc evaluate TASK --gold FILE --pred FILE [--json]`: a task's official metric on its official files."""

import json
import sys
from pathlib import Path

from longdoc.commands.task_flags import flags_by_task, refuse_other_tasks_flags
from longdoc.errors import InputError
from longdoc.evaluate.scoring import score_files
from longdoc.evaluate.tables import markdown_table
from longdoc.tasks import get_task, task_names

HELP = "score an official prediction file against its gold file with the task's official metric"


def _metric_options(task):
    return task.metric_options


def add_metric_arguments(parser) -> None:
    """Every task's metric options as flags, and --allow-missing (`longdoc evaluate`, `longdoc serve --task`)."""
    parser.add_argument("--allow-missing", action="store_true",
                        help="score a prediction file that leaves gold examples out or has ids the gold lacks, as "
                             "the official script does (missing examples count as wrong, unknown ids are ignored, "
                             "with warnings); without it such a file is an error. NQ's and OpenKP's official "
                             "scripts refuse such files whatever this flag says")
    for option, tasks in flags_by_task(_metric_options).values():
        parser.add_argument(option.flag, type=option.type, metavar=option.type.__name__.upper(),
                            help=f"{', '.join(tasks)} only: {option.help} (default {option.default})")


def add_arguments(parser) -> None:
    names = task_names()
    parser.add_argument("task", metavar="TASK", choices=names, help=f"one of: {', '.join(names)}")
    parser.add_argument("--gold", required=True, type=Path, help="the official gold (dev) file")
    parser.add_argument("--pred", required=True, type=Path, help="the prediction file, in the official format")
    parser.add_argument("--json", action="store_true", help="print one JSON object with the official key names")
    add_metric_arguments(parser)
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="also write DIR/metrics.json, for `longdoc leaderboard`")
    parser.add_argument("--split", help="split name recorded in metrics.json (with --out); a run without one "
                                        "is ranked apart from the dev runs")
    parser.add_argument("--model", help="model name recorded in metrics.json (with --out)")


def task_metric_options(args) -> dict:
    """The chosen task's metric options: given on the command line, else the Task record's defaults."""
    task = get_task(args.task)
    refuse_other_tasks_flags(args, task, _metric_options)
    given = {option.name: getattr(args, option.name) for option in task.metric_options
             if getattr(args, option.name) is not None}
    return {**task.metric_defaults(), **given}


def run(args) -> int:
    from longdoc.evaluate.leaderboard import write_metrics_json

    options = task_metric_options(args)
    if (args.split or args.model) and not args.out:
        raise InputError("--split and --model are recorded in metrics.json: give --out DIR too")
    metrics = score_files(get_task(args.task), args.gold, args.pred, allow_missing=args.allow_missing, **options)
    if args.json:
        print(json.dumps(metrics))
    else:
        # repr: the shortest text that reads back as the same float, so nothing is rounded away.
        print(markdown_table(["metric", "value"], [[key, repr(value)] for key, value in metrics.items()]))
    if args.out:
        config = {"gold": str(args.gold.resolve()), "pred": str(args.pred.resolve()), **options,
                  **({"allow_missing": True} if args.allow_missing else {})}
        path = write_metrics_json(args.out, task=args.task, split=args.split, model=args.model, config=config,
                                  metrics=metrics, gold=args.gold)
        print(f"wrote {path}", file=sys.stderr)
    return 0
