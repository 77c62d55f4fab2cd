"""How much sooner `longdoc train` starts training when its rows come from the feature cache.

  python scripts/bench_feature_cache.py --data TRAIN_FILE [--task multihop] [--json FILE] [-- TRAIN OPTIONS]

Runs the same `longdoc train TASK --train TRAIN_FILE` twice, each with its own --out, on an empty
feature cache: the first run builds the training rows and stores them, the second reads them. Each
time is from the command's start to its first training step (when the engine opens the run's
train_log.jsonl, just before the first step; one step of one row is then run). The lifted MiniLM
and the attention kernel are made ready first, outside the timings. Prints a markdown table with
both times and their ratio, the CPU and the load.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path


def cpu_description() -> str:
    """The CPU's model name and its widest vector instructions (AVX-512 or AVX2), from /proc/cpuinfo."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown CPU"
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    vectors = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{name}, {vectors}, {os.cpu_count()} cores"


def seconds_to_first_step(command: list[str], out: Path, environment: dict) -> tuple[float, str]:
    """(seconds from the command's start until it opens out/train_log.jsonl, what it said on stderr)."""
    started = time.perf_counter()
    process = subprocess.Popen(command, env=environment, stderr=subprocess.PIPE, text=True)
    reached = None
    while process.poll() is None:
        if reached is None and (out / "train_log.jsonl").exists():
            reached = time.perf_counter() - started
        time.sleep(0.05)
    said = process.stderr.read()
    if process.returncode != 0 or reached is None:
        raise SystemExit(f"{' '.join(command)} failed ({process.returncode}):\n{said}")
    return reached, said


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="the training file")
    parser.add_argument("--task", default="multihop")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the result as JSON")
    parser.add_argument("train_options", nargs="*", help="more `longdoc train` options (after --)")
    args = parser.parse_args(argv)

    from longdoc.convert.pretrained import default_model_path
    from longdoc.model import kernels
    from longdoc.model.cache import ENVIRONMENT_VARIABLE, cache_dir

    default_model_path()  # lifted once, outside the timings
    kernels.compiled()
    with tempfile.TemporaryDirectory(prefix="bench-feature-cache-") as work:
        work = Path(work)
        # An empty feature cache, with the lifted MiniLM and the compiled kernel of the usual one.
        (work / "cache").mkdir()
        for name in ("lifted", "kernels"):
            (work / "cache" / name).symlink_to(cache_dir() / name)
        environment = {**os.environ, ENVIRONMENT_VARIABLE: str(work / "cache")}
        runs = []
        for name in ("first", "second"):
            out = work / name
            command = [sys.executable, "-m", "longdoc.cli", "--quiet", "train", args.task, "--train", str(args.data),
                       "--out", str(out), "--max-steps", "1", "--batch-size", "1", "--save-steps", "1",
                       *args.train_options]
            seconds, said = seconds_to_first_step(command, out, environment)
            rows_line = next((line for line in said.splitlines() if "training rows" in line), "")
            runs.append({"run": name, "seconds_to_first_step": round(seconds, 1), "rows": rows_line.split(": ", 1)[-1]})
            print(f"{name}: {seconds:.1f} s to the first step ({rows_line})", file=sys.stderr)
    ratio = runs[0]["seconds_to_first_step"] / runs[1]["seconds_to_first_step"]
    result = {"data": str(args.data), "task": args.task, "runs": runs, "ratio": round(ratio, 1),
              "cpu": cpu_description(), "load_average": os.getloadavg()[0], "date": date.today().isoformat()}
    print("| run | seconds to the first step | rows |\n| --- | --- | --- |")
    for run in runs:
        print(f"| {run['run']} | {run['seconds_to_first_step']} | {run['rows']} |")
    print(f"\nratio {ratio:.1f}x; {result['cpu']}; load average {result['load_average']:.1f}; {result['date']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
