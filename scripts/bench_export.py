"""ONNX Runtime against PyTorch (the compiled C++ attention kernel) on the exported model, each run in a
fresh process: the encoder's forward pass at several lengths, and `longdoc predict` on a dataset file.

    python scripts/bench_export.py encoder --lengths 1024 4096 16384 --work DIR
    python scripts/bench_export.py predict --task hotpotqa --data FILE --work DIR

The models (made once in --work, reused after): `encoder`, all-MiniLM-L6-v2 lifted as the default
model is (absolute positions tiled, ETC-base's radius 84) with long_max_len the longest length
asked for, exported; `predict`, a task model on the default lifted MiniLM with fresh heads (seed 0:
its predictions mean nothing, its time and memory are those of a trained one), exported. Each
measurement is one process: the model is loaded, one batch (or file) runs once to warm up, then
`--repeats` times; the median time is reported. Peak memory: the process's resident high-water mark
(VmHWM) at the end, and for the encoder the peak of the timed forward passes above what was resident
before them (longdoc.bench.memory). Torch and ONNX Runtime both get `--threads` threads.

Each table gives ONNX Runtime's time as a ratio of PyTorch's measured in the same run, and compares
the two runtimes' results: the encoder's hidden states within the export check's tolerance
(longdoc.export.check.TOLERANCE), predict's prediction files byte for byte. A comparison that fails
is printed and the script exits with status 1 after the table.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

GLOBAL_TOKENS = 256  # HotpotQA's global_max_len, ETC's
RUNTIMES = ("torch", "onnx")


def _process_peak_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def encoder_folder(work: Path, long_max_len: int) -> Path:
    """MiniLM lifted with the default model's options and `long_max_len`, exported (once)."""
    from longdoc.convert.pretrained import DEFAULT_POSITIONS, lifted_minilm
    from longdoc.export.folder import export_folder
    from longdoc.tasks import REGISTRY

    exported = work / f"encoder-{long_max_len}"
    if not exported.is_dir():
        lifted = lifted_minilm(positions=DEFAULT_POSITIONS, long_max_len=long_max_len)
        export_folder(lifted, exported, REGISTRY, progress=lambda text: print(f"  {text}", file=sys.stderr))
    return exported


def task_folder(work: Path, task_name: str) -> Path:
    """A `task_name` model on the default lifted MiniLM with fresh heads (seed 0), exported (once)."""
    import torch

    from longdoc.model_folder import read_tokenizer
    from longdoc.convert.pretrained import default_model_path
    from longdoc.export.folder import export_folder
    from longdoc.tasks import REGISTRY
    from longdoc.tasks import get_task

    exported = work / f"{task_name}-exported"
    if not exported.is_dir():
        torch.manual_seed(0)
        init = default_model_path()
        model = get_task(task_name).load("model").from_encoder(init)
        model.save_pretrained(work / task_name)
        read_tokenizer(init).save_pretrained(work / task_name)
        export_folder(work / task_name, exported, REGISTRY, progress=lambda text: print(f"  {text}", file=sys.stderr))
    return exported


def encoder_worker(args) -> dict:
    """One runtime at one length in this process: median seconds, peak memory; the hidden states of the
    last pass saved in `args.outputs` (.npz)."""
    import torch

    from longdoc.bench.memory import PeakMemory
    from longdoc.export.signature import ENCODER_OUTPUTS, KIND_ENCODER, GraphSignature, encoder_input_specs, sample_batch
    from longdoc.model.config import GlobalLocalConfig
    from longdoc.model.pretrained import GlobalLocalModel

    torch.set_num_threads(args.threads)
    config = GlobalLocalConfig.from_pretrained(args.model)
    signature = GraphSignature(KIND_ENCODER, encoder_input_specs(config), ENCODER_OUTPUTS)
    inputs = sample_batch(signature, config, length=args.length, num_globals=GLOBAL_TOKENS, batch=1, padding=False)
    if args.runtime == "onnx":
        from longdoc.export.runtime import load_onnx_model

        runner = load_onnx_model(args.model, threads=args.threads)
    else:
        runner = GlobalLocalModel.from_pretrained(args.model).eval()
        runner.set_attention_backend("cpu")  # the compiled C++ kernels
    with torch.no_grad():
        runner(**inputs)  # warm-up
        seconds = []
        with PeakMemory("cpu") as peak:
            for _ in range(args.repeats):
                started = time.perf_counter()
                output = runner(**inputs)
                seconds.append(time.perf_counter() - started)
    np.savez(args.outputs, **{name: getattr(output, name).float().numpy() for name in ENCODER_OUTPUTS})
    return {"runtime": args.runtime, "length": args.length, "seconds": statistics.median(seconds),
            "forward_peak_mib": peak.peak_mib, "process_peak_mib": _process_peak_mib()}


def predict_worker(args) -> dict:
    """`longdoc predict` in this process with one runtime: its summary and the process's peak memory."""
    import contextlib
    import io

    import torch

    from longdoc.cli import main

    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        status = main(["predict", args.task, "--model", str(args.model), "--data", str(args.data), "--out",
                       str(args.out), "--runtime", args.runtime, "--json", "--quiet"])
    if status != 0:
        raise SystemExit(status)
    return {**json.loads(stdout.getvalue()), "process_peak_mib": _process_peak_mib()}


def _in_fresh_process(worker: str, **options) -> dict:
    command = [sys.executable, __file__, worker, *[f"--{name.replace('_', '-')}={value}" for name, value in options.items()]]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def largest_difference(torch_file: Path, onnx_file: Path) -> tuple[float, bool]:
    """The largest difference between the two runtimes' hidden states, and whether every one is within
    the export check's tolerance (relative to values over 1)."""
    from longdoc.export.check import TOLERANCE

    largest, within = 0.0, True
    with np.load(torch_file) as expected, np.load(onnx_file) as got:
        for name in expected.files:
            difference = np.abs(expected[name] - got[name])
            largest = max(largest, float(difference.max()))
            allowed = TOLERANCE * np.maximum(1.0, np.abs(expected[name]))
            within &= bool(np.isfinite(got[name]).all() and (difference <= allowed).all())
    return largest, within


def bench_encoder(args) -> int:
    folder = encoder_folder(args.work, max(args.lengths))
    print(f"model: {folder} (the lifted MiniLM, exported); batch 1, {GLOBAL_TOKENS} global tokens, {args.threads} "
          f"threads, median of {args.repeats} after a warm-up, each runtime and length in a fresh process\n")
    print("| L | torch (cpu kernel) s | onnx s | onnx / torch | largest difference | torch forward MiB | "
          "onnx forward MiB | torch process MiB | onnx process MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    failed = []
    with tempfile.TemporaryDirectory() as scratch:
        for length in args.lengths:
            outputs = {runtime: Path(scratch) / f"{runtime}-{length}.npz" for runtime in RUNTIMES}
            rows = {runtime: _in_fresh_process("encoder-worker", model=folder, runtime=runtime, length=length,
                                               threads=args.threads, repeats=args.repeats, outputs=outputs[runtime])
                    for runtime in RUNTIMES}
            torch_row, onnx_row = rows["torch"], rows["onnx"]
            difference, within = largest_difference(outputs["torch"], outputs["onnx"])
            if not within:
                failed.append(length)
            print(f"| {length} | {torch_row['seconds']:.3f} | {onnx_row['seconds']:.3f} | "
                  f"{onnx_row['seconds'] / torch_row['seconds']:.2f} | {difference:.2g}{'' if within else ' (OVER)'} | "
                  f"{torch_row['forward_peak_mib']:.0f} | {onnx_row['forward_peak_mib']:.0f} | "
                  f"{torch_row['process_peak_mib']:.0f} | {onnx_row['process_peak_mib']:.0f} |", flush=True)
    if failed:
        print(f"\nFAILED: the runtimes' hidden states differ beyond the export check's tolerance at "
              f"{', '.join(map(str, failed))} long tokens", file=sys.stderr)
        return 1
    return 0


def bench_predict(args) -> int:
    folder = task_folder(args.work, args.task)
    print(f"model: {folder} ({args.task} heads fresh on the default lifted MiniLM, exported); data {args.data}; "
          f"{args.threads} threads; each runtime in a fresh process, {args.repeats} runs\n")
    print("| runtime | seconds | examples/s | time / torch | windows | process peak MiB |")
    print("|---|---|---|---|---|---|")
    outputs, medians = {}, {}
    with tempfile.TemporaryDirectory() as scratch:
        for runtime in RUNTIMES:
            runs = []
            for run in range(args.repeats):
                out = Path(scratch) / f"{runtime}-{run}.json"
                runs.append(_in_fresh_process("predict-worker", model=folder, task=args.task, data=args.data,
                                              out=out, runtime=runtime, threads=args.threads))
                outputs[runtime] = out.read_text(encoding="utf-8")
            seconds = medians[runtime] = statistics.median(run["seconds"] for run in runs)
            print(f"| {runtime} | {seconds:.1f} | {runs[0]['examples'] / seconds:.2f} | "
                  f"{seconds / medians['torch']:.2f} | {runs[0]['windows']} | "
                  f"{max(run['process_peak_mib'] for run in runs):.0f} |", flush=True)
    if outputs["torch"] != outputs["onnx"]:
        print("\nFAILED: the runtimes' prediction files differ", file=sys.stderr)
        return 1
    print("\nprediction files identical between the runtimes")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    encoder = commands.add_parser("encoder", help="the encoder's forward pass at several lengths")
    encoder.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    predict = commands.add_parser("predict", help="longdoc predict on a dataset file")
    predict.add_argument("--task", default="hotpotqa")
    predict.add_argument("--data", type=Path, required=True)
    for sub in (encoder, predict):
        sub.add_argument("--work", type=Path, required=True, help="where the models are made (reused)")
        sub.add_argument("--threads", type=int, default=os.cpu_count())
        sub.add_argument("--repeats", type=int, default=3)
    worker = commands.add_parser("encoder-worker")
    for name in ("--model", "--runtime"):
        worker.add_argument(name, required=True)
    worker.add_argument("--length", type=int, required=True)
    worker.add_argument("--outputs", type=Path, required=True)
    worker.add_argument("--threads", type=int, required=True)
    worker.add_argument("--repeats", type=int, required=True)
    task_worker = commands.add_parser("predict-worker")
    for name in ("--model", "--task", "--data", "--out", "--runtime"):
        task_worker.add_argument(name, required=True)
    task_worker.add_argument("--threads", type=int, required=True)
    args = parser.parse_args()
    if args.command == "encoder-worker":
        print(json.dumps(encoder_worker(args)))
    elif args.command == "predict-worker":
        print(json.dumps(predict_worker(args)))
    else:
        args.work.mkdir(parents=True, exist_ok=True)
        raise SystemExit((bench_encoder if args.command == "encoder" else bench_predict)(args))


if __name__ == "__main__":
    main()
