"""`longdoc train TASK --train FILE --dev FILE --out DIR [options]`: fine-tune a task model on the one
training engine (longdoc.train); under torchrun it trains data-parallel."""

import argparse
import json
import sys
from typing import Any, Callable, Iterable, Mapping

from longdoc.commands import INTERRUPTED_STATUS
from longdoc.commands.task_flags import flags_by_task, refuse_other_tasks_flags
from longdoc.data.options import Option
from longdoc.tasks import get_task, task_names
from longdoc.train.options import ENGINE_OPTIONS, resolve_task_options

HELP = "train a task model (resumes from --out; runs data-parallel under torchrun)"
OWN_HELP = True  # -h/--help is _TaskHelp, not argparse's (longdoc.cli)


def _train_options(task):
    return task.train_options


def add_option_arguments(parser, options: Iterable[Option], only_for: Mapping[str, str] | None = None) -> None:
    """Add each option to an argparse parser with default None, so that what the command line gave
    can be told apart from what it left to the config file and the defaults."""
    for option in options:
        where = f"{only_for[option.name]} only: " if only_for and option.name in only_for else ""
        default_text = "" if option.default is None else f" (default {option.default})"
        if option.type is bool:
            parser.add_argument(option.flag, dest=option.name, action=argparse.BooleanOptionalAction, default=None,
                                help=where + option.help + default_text)
        else:
            parser.add_argument(option.flag, dest=option.name, type=option.type, default=None,
                                metavar=option.metavar or option.type.__name__.upper(),
                                help=where + option.help + default_text)





class _TaskHelp(argparse.Action):
    """-h/--help: after TASK (`longdoc train TASK --help`) the shared options and that task's own,
    the other tasks' hidden; before it, every task's."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        task = getattr(namespace, "task", None)
        if task is not None:
            others = {name for name, (_, tasks) in flags_by_task(_train_options).items() if task not in tasks}
            for action in parser._actions:
                if action.dest in others:
                    action.help = argparse.SUPPRESS
        parser.print_help()
        parser.exit()


def add_arguments(parser) -> None:
    names = task_names()
    parser.add_argument("-h", "--help", action=_TaskHelp,
                        help="show this help and exit; after TASK, with that task's options only")
    parser.add_argument("task", metavar="TASK", choices=names, help=f"one of: {', '.join(names)}")
    parser.add_argument("--config", metavar="FILE|NAME",
                        help="options in a JSON or YAML file, or the name of a config the task ships "
                             "(tasks/TASK/configs/NAME.json); the command line overrides it")
    parser.add_argument("--json", action="store_true",
                        help="at the end, print one JSON object on stdout: status, run folder, steps, dev metrics, "
                             "the files written")
    add_option_arguments(parser, ENGINE_OPTIONS)
    task_options = flags_by_task(_train_options)
    add_option_arguments(parser, [option for option, _ in task_options.values()],
                         only_for={name: ", ".join(tasks) for name, (_, tasks) in task_options.items()})


def run(args) -> int:
    from longdoc.train.finetune import train_task

    task = get_task(args.task)
    refuse_other_tasks_flags(args, task, _train_options)
    given = {option.name: getattr(args, option.name) for option in (*ENGINE_OPTIONS, *task.train_options)}
    options, task_options = resolve_task_options(task, given, args.config)

    def done(result) -> str:
        shown = ", ".join(f"{key} {value:.4f}" for key, value in result.metrics.items())
        return f"{args.task} model in {options.out} after {result.step} steps" + (f"; dev: {shown}" if shown else "")

    def summary(result) -> dict[str, Any]:
        return run_summary(args.task, options.out, result)

    return run_and_report("train", lambda: train_task(task, options, task_options, progress=args.progress), done,
                          summary if args.json else None)


def run_summary(task_name: str, out, result) -> dict[str, Any]:
    """`longdoc train --json`'s object: how the run ended and the files its folder holds (a finished
    run's folder is also the final model, for `longdoc predict TASK --model OUT`)."""
    from longdoc.evaluate.leaderboard import METRICS_FILE
    from longdoc.train.engine import TRAIN_LOG_FILE
    from longdoc.train.finetune import DEV_PREDICTIONS_FILE
    from longdoc.train.options import RESOLVED_OPTIONS_FILE

    files = {"options": out / RESOLVED_OPTIONS_FILE, "log": out / TRAIN_LOG_FILE, "metrics": out / METRICS_FILE,
             "dev_predictions": out / DEV_PREDICTIONS_FILE}
    return {
        "task": task_name, "status": "interrupted" if result.interrupted else "finished", "out": str(out),
        "step": result.step, "total_steps": result.total_steps, "dev_metrics": result.metrics,
        "checkpoint": None if result.checkpoint is None else str(result.checkpoint),
        "files": {name: str(path) for name, path in files.items() if path.is_file()},
    }


def run_and_report(command: str, train: Callable[[], Any], done: Callable[[Any], str],
                   summary: Callable[[Any], dict] | None = None) -> int:
    """The exit status of a run on the training engine (`longdoc train`, `longdoc pretrain`): `train()`
    returns the engine's TrainingResult; the main process says on stderr how it ended (`done(result)`
    for a finished run) and, given `summary`, prints `summary(result)` on stdout as one JSON object.
    1: a checkpoint that cannot be resumed; INTERRUPTED_STATUS: stopped with a checkpoint, to resume by
    rerunning."""
    from longdoc.train.checkpoints import CheckpointError

    try:
        result = train()
    except CheckpointError as error:
        print(f"longdoc {command}: error: {error}", file=sys.stderr)
        return 1
    if result.is_main and summary is not None:
        print(json.dumps(summary(result)))
    if result.interrupted:
        if result.is_main:
            print(f"longdoc {command}: stopped at step {result.step} of {result.total_steps}; checkpoint "
                  f"{result.checkpoint}; rerun the same command to resume", file=sys.stderr)
        return INTERRUPTED_STATUS
    if result.is_main:
        print(f"longdoc {command}: {done(result)}", file=sys.stderr)
    return 0
