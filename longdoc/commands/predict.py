"""`longdoc predict TASK --model DIR --data FILE --out FILE [--batch-size N]`: a trained model's
official prediction file for a dataset file."""

import sys
from pathlib import Path

from longdoc.errors import InputError
from longdoc.tasks import get_task, task_names

HELP = "write the official prediction file of a trained task model for a dataset file"


def add_arguments(parser) -> None:
    names = task_names()
    parser.add_argument("task", metavar="TASK", choices=names, help=f"one of: {', '.join(names)}")
    parser.add_argument("--model", required=True, type=Path, metavar="DIR",
                        help="a trained model folder (the --out of `longdoc train TASK`)")
    parser.add_argument("--data", required=True, type=Path, metavar="FILE", help="the dataset file, official format")
    parser.add_argument("--out", required=True, type=Path, metavar="FILE", help="where to write the prediction file")
    parser.add_argument("--batch-size", type=int, default=8, metavar="N", help="windows per forward pass (default 8)")


def run(args) -> int:
    from longdoc.convert.checkpoint import read_tokenizer

    task = get_task(args.task)
    if task.decode is None or task.model is None:
        raise InputError(f"the {args.task} task cannot predict yet (it has no model/decoder)")
    if args.batch_size < 1:
        raise InputError(f"--batch-size must be >= 1, got {args.batch_size}")
    if not args.data.is_file():
        raise InputError(f"{args.data}: no such file (--data takes a {args.task} file in its official format)")
    model = task.load("model").from_pretrained(args.model)
    tokenizer = read_tokenizer(args.model)
    path = task.load("decode").predict(model, args.data, args.out, tokenizer=tokenizer, options=None,
                                       batch_size=args.batch_size)
    print(f"wrote {path}", file=sys.stderr)
    return 0
