"""`longdoc predict TASK --model DIR --data FILE --out FILE [--batch-size N] [--device DEV] [--dtype T]
[--runtime auto|torch|onnx] [--json]`:
a trained model's official prediction file for a dataset file, and the scores side file beside it
(FILE.scores.jsonl, longdoc.data.prediction_scores) for a task whose official file has no room for
its scores. Under `torchrun --nproc_per_node N $(which longdoc) predict ...` the processes share the
model's work and the main process writes the same files (longdoc.data.shared_prediction)."""

import json
import sys
import time
from pathlib import Path

from longdoc.model import inference
from longdoc.commands import INTERRUPTED_STATUS
from longdoc.errors import InputError
from longdoc.commands.model_flags import add_compile_argument, add_placement_arguments, add_runtime_argument
from longdoc.export.serving import load_task_model, resolve_runtime
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
    add_placement_arguments(parser)
    add_runtime_argument(parser)
    add_compile_argument(parser)
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object on stdout at the end: the prediction file, its scores side file "
                             "(or null), task, examples and windows predicted, seconds, examples per second, device, "
                             "dtype and runtime; under torchrun, each process's examples, windows and model seconds")


class _WindowCounter:
    """Counts the windows (batch rows) the model runs, from a forward hook, while in a `with` block."""

    def __init__(self, model):
        self.model, self.windows = model, 0

    def _count(self, module, args, kwargs, output) -> None:
        self.windows += len(kwargs["long_input_ids"])

    def __enter__(self) -> "_WindowCounter":
        self.hook = self.model.register_forward_hook(self._count, with_kwargs=True)
        return self

    def __exit__(self, *exc) -> None:
        self.hook.remove()


def _interrupted(processes, out: Path) -> int:
    """Ctrl-C under torchrun: the main process says what is kept (the packs saved so far, which the
    same command reuses)."""
    from longdoc.data.shared_prediction import shards_folder

    if processes.is_main:
        folder = shards_folder(out)
        kept = (f"the predictions completed so far are kept in {folder}; the same command continues from them"
                if any(folder.glob("*.pt")) else "nothing written")
        print(f"longdoc predict: interrupted; {kept}", file=sys.stderr)
    return INTERRUPTED_STATUS


def run(args) -> int:
    from longdoc.data.shared_prediction import (PredictionRun, model_fingerprint, predict_in_processes,
                                                sha256_of_data, shards_folder)
    from longdoc.model_folder import load_model, read_model_folder, read_tokenizer
    from longdoc.distributed import launched_by_torchrun, start_processes, stop_processes

    task = get_task(args.task)
    if task.decode is None or task.model is None:
        raise InputError(f"the {args.task} task cannot predict yet (it has no model/decoder)")
    if args.batch_size < 1:
        raise InputError(f"--batch-size must be >= 1, got {args.batch_size}")
    if not args.data.exists():
        raise InputError(f"{args.data}: no such file or folder (--data takes a {args.task} file in its official "
                         "format, or the Hub's datasets export of it)")
    if not args.out.parent.is_dir():  # a mistyped path is told, not made
        raise InputError(f"--out {args.out}: no such folder {args.out.parent}; create it first")
    # Under torchrun, its processes share the work out: longdoc.data.shared_prediction.
    processes = start_processes() if launched_by_torchrun() else None
    device, dtype = inference.resolve_placement(args.device, args.dtype)
    runtime = resolve_runtime(args.runtime, args.model, device, dtype if args.dtype else None, args.attention)
    model_class = task.load("model")
    folder = read_model_folder(args.model, model_class.task_name)
    if runtime == "onnx" and args.compile:
        raise InputError("--compile compiles the PyTorch model, and the runtime here is onnx (the folder's exported "
                         "graph): add --runtime torch")
    if runtime == "onnx":
        model, tokenizer = load_task_model(folder, model_class.task_name, device), read_tokenizer(args.model)
    else:
        model, tokenizer = load_model(args.model, model_class, folder.model_config())
        model = inference.place_model(model, device, dtype, args.model, attention=args.attention)
        if args.compile:
            inference.compile_model(model, device, "--compile")
    started = time.perf_counter()
    with _WindowCounter(model) as counter:
        if processes is not None:
            prediction_run = PredictionRun(args.task, sha256_of_data(args.data), model_fingerprint(args.model),
                                           args.batch_size, device.type, str(dtype).removeprefix("torch."), runtime)
            try:
                shared = predict_in_processes(task.load("decode").predict, model, args.data, args.out,
                                              run=prediction_run, processes=processes, progress=args.progress,
                                              tokenizer=tokenizer, options=None, batch_size=args.batch_size)
            except KeyboardInterrupt:
                return _interrupted(processes, args.out)
            predicted, windows = shared.predicted, shared.windows
        else:
            predicted = task.load("decode").predict(model, args.data, args.out, tokenizer=tokenizer, options=None,
                                                    batch_size=args.batch_size, progress=args.progress)
            windows = counter.windows
    seconds = time.perf_counter() - started
    if processes is not None:
        stop_processes(processes)
        if not processes.is_main:  # the main process tells
            return 0
        print("processes: " + ", ".join(f"{rank}: {share.examples} examples ({share.windows} windows) in "
                                        f"{share.seconds:.1f} s" for rank, share in enumerate(shared.shares)),
              file=sys.stderr)
        if shared.reused_examples:
            print(f"reused {shared.reused_examples} of {shared.examples} examples ({shared.reused_windows} of "
                  f"{windows} windows) predicted by an interrupted run ({shards_folder(args.out)})", file=sys.stderr)
    path, examples = predicted.path, predicted.examples
    summary = {"predictions": str(path), "scores": None if predicted.scores is None else str(predicted.scores),
               "task": args.task, "examples": examples, "windows": windows,
               "seconds": round(seconds, 3), "examples_per_second": round(examples / seconds, 3),
               "device": str(device), "dtype": str(dtype).removeprefix("torch."), "runtime": runtime}
    if processes is not None:
        summary["processes"] = [{"examples": share.examples, "windows": share.windows,
                                 "seconds": round(share.seconds, 3)} for share in shared.shares]
    print(f"wrote {path}: {examples} examples ({windows} windows) in {seconds:.1f} s, "
          f"{summary['examples_per_second']} examples/s on {summary['device']} in {summary['dtype']}"
          + (" (ONNX Runtime)" if runtime == "onnx" else "")
          + ("" if predicted.scores is None else f"; scores in {predicted.scores}"), file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
    return 0
