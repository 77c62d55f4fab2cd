"""The attention study of docs/analysis.md: residual attention (RealFormer) and talking heads against a
plain baseline, on small models trained from the same random weights on the built-in multihop task,
each scored with the official HotpotQA metric and measured with `longdoc analyze attention`.

    python scripts/study_attention.py --out study [--steps 300] [--seeds 0 1] [--workers 2]

1. Data: `longdoc make-data multihop`, 400 training and 50 held-out documents of 256 wordpieces.
2. One random encoder (SHAPE, drawn with torch seed 0) that every run starts from; the architectures
   differ only in `longdoc train`'s --residual-attention and --talking-heads switches (the talking-heads
   mixes start at identity, so those runs start from the same function as the baseline).
3. Runs: `longdoc train multihop` per architecture and seed, same steps, batch and rate, one thread
   each, `--workers` at a time, architectures interleaved so a busy machine slows them alike.
4. `longdoc analyze attention --task multihop` of every trained model on the held-out documents.
5. OUT/results.json (every run's figures) and OUT/report.md (the tables), printed on stdout.

A rerun on the same OUT skips what is done (a run folder with metrics.json, an analysis.json).
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SHAPE = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=256, local_radius=32,
             long_max_len=256, global_max_len=96, max_relative_distance=8, relative_vocab_size=32)
ARCHITECTURES = {
    "baseline": ("--no-residual-attention", "--no-talking-heads"),
    "residual": ("--residual-attention", "--no-talking-heads"),
    "talking-heads": ("--no-residual-attention", "--talking-heads"),
    "residual+talking-heads": ("--residual-attention", "--talking-heads"),
}
METRICS = ("em", "f1", "sp_f1", "joint_f1")  # the official HotpotQA metric's answer, support and joint scores
# (statistic, piece) -> heading: each the mean over layers of the per-layer means (all heads and queries)
ATTENTION = {("normalized_entropy", "long"): "H/log n long", ("normalized_entropy", "global"): "H/log n global",
             ("top_10pct", "long"): "top10% long", ("js_divergence", "long"): "JS long",
             ("carried_share", "long"): "carried long"}


def longdoc(*argv) -> subprocess.CompletedProcess:
    """A longdoc command on one thread; its failure ends the study with its stderr."""
    done = subprocess.run([sys.executable, "-m", "longdoc.cli", *map(str, argv)], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    if done.returncode:
        sys.exit(f"longdoc {' '.join(map(str, argv))} failed:\n{done.stderr}")
    return done


def prepare(out: Path) -> tuple[Path, Path, Path]:
    """(training file, held-out file, the random encoder every run starts from)."""
    import torch

    from longdoc import GlobalLocalConfig, GlobalLocalModel
    from longdoc.convert.model_folder import read_tokenizer
    from longdoc.convert.pretrained import minilm_path

    train, dev, init = out / "multihop_train.json", out / "multihop_dev.json", out / "init"
    for path, count, seed in ((train, 400, 1), (dev, 50, 2)):
        if not path.is_file():
            longdoc("make-data", "multihop", "--n", count, "--length", 256, "--relation-share", 0.1, "--seed", seed,
                    "--out", path, "--quiet")
    if not init.is_dir():
        tokenizer = read_tokenizer(Path(minilm_path()))
        torch.manual_seed(0)
        GlobalLocalModel(GlobalLocalConfig(vocab_size=len(tokenizer), **SHAPE)).save_pretrained(init)
        tokenizer.save_pretrained(init)
    return train, dev, init


def step_seconds(run: Path, batch: int) -> float:
    """The median over the run's logged intervals of seconds per training step."""
    lines = [json.loads(line) for line in (run / "train_log.jsonl").read_text(encoding="utf-8").splitlines()]
    return statistics.median(batch / line["examples_per_second"] for line in lines if "examples_per_second" in line)


def layer_mean(analysis: dict, statistic: str, piece: str) -> float | None:
    found = analysis["statistics"][statistic]
    means = [entry["mean"] for entry in found.get("pieces", {}).get(piece, []) if entry["values"]]
    return statistics.fmean(means) if found["applicable"] and means else None


def study(args, train: Path, dev: Path, init: Path) -> dict:
    """{run name: its figures} for every architecture and seed (module docstring, 3 and 4)."""
    runs = [(name, seed) for seed in args.seeds for name in ARCHITECTURES]

    def one(run: tuple[str, int]) -> tuple[str, dict]:
        name, seed = run
        folder, analysis = args.out / "runs" / f"{name}-s{seed}", args.out / "analyses" / f"{name}-s{seed}"
        started = time.perf_counter()
        if not (folder / "metrics.json").is_file():
            longdoc("train", "multihop", "--train", train, "--dev", dev, "--init", init, "--out", folder,
                    *ARCHITECTURES[name], "--max-steps", args.steps, "--batch-size", args.batch_size, "--lr", args.lr,
                    "--seed", seed, "--save-steps", args.steps, "--keep-last", 1, "--max-answer-length", 8, "--quiet")
        if not (analysis / "analysis.json").is_file():
            longdoc("analyze", "attention", "--model", folder, "--task", "multihop", "--data", dev, "--examples", 50,
                    "--out", analysis, "--no-plots", "--quiet")
        found = json.loads((analysis / "analysis.json").read_text(encoding="utf-8"))
        metrics = json.loads((folder / "metrics.json").read_text(encoding="utf-8"))["metrics"]
        figures = {"architecture": name, "seed": seed, **{metric: metrics[metric] for metric in METRICS},
                   "step_seconds": step_seconds(folder, args.batch_size),
                   **{heading: layer_mean(found, *key) for key, heading in ATTENTION.items()},
                   "per_layer": {heading: [entry["mean"] for entry in found["statistics"][key[0]]["pieces"][key[1]]]
                                 for key, heading in ATTENTION.items() if found["statistics"][key[0]]["applicable"]}}
        print(f"{name} seed {seed}: f1 {figures['f1']:.3f} ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
        return f"{name}-s{seed}", figures

    with ThreadPoolExecutor(args.workers) as pool:
        return dict(pool.map(one, runs))


def cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def report(results: dict, args, load: tuple[str, str], minutes: float) -> str:
    columns = [*METRICS, "step_seconds", *ATTENTION.values()]
    lines = [f"{len(results)} runs of {args.steps} steps (batch {args.batch_size}, lr {args.lr:g}), {args.workers} at a "
             f"time on {platform.machine()}; this invocation (runs already done are not rerun): {minutes:.0f} minutes, "
             f"load average {load[0]} at its start, {load[1]} at its end.", "",
             "| architecture | seed | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    for figures in results.values():
        lines.append(f"| {figures['architecture']} | {figures['seed']} | "
                     + " | ".join(cell(figures[column]) for column in columns) + " |")
    lines += ["", "Mean over seeds:", "", "| architecture | " + " | ".join(columns) + " |",
              "|---|" + "---|" * len(columns)]
    for name in ARCHITECTURES:
        rows = [figures for figures in results.values() if figures["architecture"] == name]
        means = [None if any(row[column] is None for row in rows) else statistics.fmean(row[column] for row in rows)
                 for column in columns]
        lines.append(f"| {name} | " + " | ".join(map(cell, means)) + " |")
    lines += ["", f"Per layer (seed {args.seeds[0]}), mean over heads and queries:", ""]
    for name in ARCHITECTURES:
        for heading, means in results[f"{name}-s{args.seeds[0]}"]["per_layer"].items():
            lines.append(f"- {name}, {heading}: " + " ".join(f"{mean:.3f}" for mean in means))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("study"), help="working folder (default ./study); reruns resume")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps of every run (default 300)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="training seeds (default 0 1)")
    parser.add_argument("--batch-size", type=int, default=8, help="rows per step (default 8)")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    parser.add_argument("--workers", type=int, default=2, help="runs at a time, one thread each (default 2)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started, load = time.time(), " ".join(f"{x:.1f}" for x in os.getloadavg())
    results = study(args, *prepare(args.out))
    text = report(results, args, (load, " ".join(f"{x:.1f}" for x in os.getloadavg())), (time.time() - started) / 60)
    (args.out / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    (args.out / "report.md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
