"""`longdoc train TASK --train FILE --dev FILE --out DIR [options]`: fine-tune a task model on the one
training engine (longdoc.train); under torchrun it trains data-parallel."""

import sys

from longdoc.errors import InputError
from longdoc.tasks import get_task, task_names
from longdoc.train.options import ENGINE_OPTIONS, TrainOption, add_option_arguments, resolve_options

HELP = "train a task model (resumes from --out; runs data-parallel under torchrun)"
INTERRUPTED_EXIT = 130  # the shell's status for a run stopped by Ctrl-C


def _task_options() -> dict[str, tuple[TrainOption, tuple[str, ...]]]:
    """Each task training option's flag, once, with the tasks that take it (from the Task records)."""
    found: dict[str, tuple[TrainOption, tuple[str, ...]]] = {}
    for name in task_names():
        for option in get_task(name).train_options:
            _, tasks = found.get(option.name, (None, ()))
            found[option.name] = (TrainOption(option.name, option.type, option.default, option.help), tasks + (name,))
    return found


def add_arguments(parser) -> None:
    names = task_names()
    parser.add_argument("task", metavar="TASK", choices=names, help=f"one of: {', '.join(names)}")
    parser.add_argument("--config", metavar="FILE|NAME",
                        help="options in a JSON or YAML file, or the name of a config the task ships "
                             "(tasks/TASK/configs/NAME.json); the command line overrides it")
    add_option_arguments(parser, ENGINE_OPTIONS)
    task_options = _task_options()
    add_option_arguments(parser, [option for option, _ in task_options.values()],
                         only_for={name: ", ".join(tasks) for name, (_, tasks) in task_options.items()})


def run(args) -> int:
    from longdoc.train.checkpoints import CheckpointError
    from longdoc.train.finetune import train_task

    task = get_task(args.task)
    own = [TrainOption(option.name, option.type, option.default, option.help) for option in task.train_options]
    foreign = [option for option, _ in _task_options().values()
               if option.name not in {o.name for o in own} and getattr(args, option.name) is not None]
    if foreign:
        raise InputError(f"{', '.join(option.flag for option in foreign)} does not apply to the {args.task} task")
    options_list = (*ENGINE_OPTIONS, *own)
    given = {option.name: getattr(args, option.name) for option in options_list}
    options = resolve_options(given, options_list, args.config, task.configs)
    try:
        result = train_task(task, options)
    except CheckpointError as error:
        print(f"longdoc train: error: {error}", file=sys.stderr)
        return 1
    if result.interrupted:
        if result.is_main:
            print(f"longdoc train: stopped at step {result.step} of {result.total_steps}; checkpoint "
                  f"{result.checkpoint}; rerun the same command to resume", file=sys.stderr)
        return INTERRUPTED_EXIT
    if result.is_main:
        shown = ", ".join(f"{key} {value:.4f}" for key, value in result.metrics.items())
        print(f"longdoc train: {args.task} model in {options['out']} after {result.step} steps"
              + (f"; dev: {shown}" if shown else ""), file=sys.stderr)
    return 0
