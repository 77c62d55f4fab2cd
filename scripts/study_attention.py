"""The attention study of docs/analysis.md: RealFormer's residual attention (off, on, running mean) and
talking heads (off, on) on small models trained from the same random weights, over a sweep of
learning rates and seeds, on the built-in multihop task and in continued MLM pretraining on real text.

    python scripts/study_attention.py --out study [--steps 120] [--mlm-steps 40] [--workers 2]

1. Data: `longdoc make-data multihop`, 400 training and 50 held-out documents of 256 wordpieces; plain
   text from ../shared/data (one document per HotpotQA example, its paragraphs, and per WikiHop example,
   its supports), WikiHop's dev examples held out.
2. One random encoder (SHAPE, torch seed 0) every run starts from, and the same weights with
   `residual_attention_mean` on (the running mean: the carried sum divided by the layer number, the
   model config's switch); the architectures differ only in that and in `longdoc train`'s and
   `longdoc pretrain`'s --residual-attention and --talking-heads switches (talking-heads mixes start at
   identity). `longdoc pretrain` turns residual attention on unless told otherwise: every arm passes
   its switch explicitly.
3. Talking heads' cost, first and alone (nothing else of the study running): an encoder training step
   with and without talking heads (residual attention off and on), the models stepped in turn in one
   process on one thread, the load average beside it.
4. The sweep: `longdoc train multihop` per architecture, rate and seed, and `longdoc pretrain` per
   MLM architecture, rate and seed, `--workers` at a time, one thread each, in an order that mixes
   architectures so a busy machine slows them alike. A run diverges when a logged training loss is
   NaN or its last one is above its first.
5. `longdoc analyze attention` of each architecture's runs at --analysis-rates (first seed): the
   multihop models on the held-out documents, the MLM arms on the held-out text.
6. OUT/results.json (every run's figures) and OUT/report.md (the tables), printed on stdout.

Each command runs in a worker process (longdoc.cli.main, imported once per worker). A rerun on the
same OUT skips what is done.
"""

import argparse
import itertools
import json
import math
import os
import platform
import shutil
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

SHAPE = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=128, local_radius=32,
             long_max_len=256, global_max_len=80, max_relative_distance=8, relative_vocab_size=32)
# name -> (the starting weights' folder, the run's switches)
ARCHITECTURES = {
    "plain": ("init", ("--no-residual-attention", "--no-talking-heads")),
    "residual": ("init", ("--residual-attention", "--no-talking-heads")),
    "residual-mean": ("init-mean", ("--residual-attention", "--no-talking-heads")),
    "talking-heads": ("init", ("--no-residual-attention", "--talking-heads")),
    "residual+talking-heads": ("init", ("--residual-attention", "--talking-heads")),
    "residual-mean+talking-heads": ("init-mean", ("--residual-attention", "--talking-heads")),
}
RATES = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
MULTIHOP = ("--max-answer-length", 8, "--max-question-len", 48)
# (statistic, piece) -> heading: each the mean over layers of the per-layer means (all heads and queries)
ATTENTION = {("normalized_entropy", "long"): "H/log n long", ("normalized_entropy", "global"): "H/log n global",
             ("top_10pct", "long"): "top10% long", ("js_divergence", "long"): "JS long",
             ("carried_share", "long"): "carried long"}
SHARED_DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def _worker_start() -> None:
    import torch

    torch.set_num_threads(1)


def longdoc(argv: list) -> dict:
    """One longdoc command in this (worker) process: its exit status and seconds."""
    from longdoc.cli import main

    started = time.perf_counter()
    try:
        status = main([str(arg) for arg in argv])
    except Exception as error:  # a run that fails (a diverged run's NaNs, say) is a result, not the study's end
        status = f"{type(error).__name__}: {error}"
    return {"status": status, "seconds": time.perf_counter() - started}


def load() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def prepare(out: Path) -> dict[str, Path]:
    """The study's data and starting weights (module docstring, 1 and 2)."""
    import torch

    from longdoc import GlobalLocalConfig, GlobalLocalModel
    from longdoc.model_folder import read_tokenizer
    from longdoc.convert.pretrained import minilm_path

    paths = {name: out / name for name in ("multihop_train.json", "multihop_dev.json", "text_train", "text_dev",
                                           "init", "init-mean")}
    for name, count, seed in (("multihop_train.json", 400, 1), ("multihop_dev.json", 50, 2)):
        if not paths[name].is_file():
            done = longdoc(["make-data", "multihop", "--n", count, "--length", 256, "--relation-share", 0.1,
                            "--seed", seed, "--out", paths[name], "--quiet"])
            if done["status"] != 0:
                sys.exit(f"longdoc make-data failed: {done['status']}")
    if not paths["text_dev"].is_dir():
        documents = {"text_train": [], "text_dev": []}
        hotpotqa = json.loads((SHARED_DATA / "hotpotqa" / "hotpot_dev_distractor_v1.first53.json").read_text("utf-8"))
        paragraphs = lambda example: ["".join(sentences).strip() for _, sentences in example["context"]]
        documents["text_train"] += [(example["_id"], paragraphs(example)) for example in hotpotqa]
        for split, folder in (("train.first22", "text_train"), ("dev.first28", "text_dev")):
            wikihop = json.loads((SHARED_DATA / "wikihop" / f"wikihop_{split}.json").read_text("utf-8"))
            documents[folder] += [(example["id"], example["supports"]) for example in wikihop]
        for folder, found in documents.items():
            paths[folder].mkdir(parents=True, exist_ok=True)
            for name, paragraphs in found:
                (paths[folder] / f"{name}.txt").write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
    if not paths["init-mean"].is_dir():
        tokenizer = read_tokenizer(Path(minilm_path()))
        for name, mean in (("init", False), ("init-mean", True)):
            torch.manual_seed(0)
            config = GlobalLocalConfig(vocab_size=len(tokenizer), residual_attention_mean=mean, **SHAPE)
            GlobalLocalModel(config).save_pretrained(paths[name])
            tokenizer.save_pretrained(paths[name])
    return paths


def train_argv(kind: str, architecture: str, rate: float, seed: int, steps: int, paths: dict, folder: Path) -> list:
    init, switches = ARCHITECTURES[architecture]
    common = ["--init", paths[init], "--out", folder, *switches, "--max-steps", steps, "--batch-size", 8, "--lr", rate,
              "--seed", seed, "--save-steps", steps, "--keep-last", 1, "--log-steps", 5, "--quiet"]
    if kind == "multihop":
        return ["train", "multihop", "--train", paths["multihop_train.json"], "--dev", paths["multihop_dev.json"],
                *common, *MULTIHOP]
    return ["pretrain", "--train", paths["text_train"], "--dev", paths["text_dev"], *common, "--eval-rows", 32]


def logged(folder: Path) -> list[dict]:
    path = folder / "train_log.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.is_file() else []


def step_seconds(folder: Path) -> float | None:
    """The median over the run's logged intervals, the first left out (warm-up), of seconds per step."""
    rates = [line["examples_per_second"] for line in logged(folder) if line.get("examples_per_second")]
    return statistics.median(8 / rate for rate in rates[1:]) if rates[1:] else None


def run_figures(kind: str, folder: Path, done: dict) -> dict:
    """A finished run's figures: its score (answer F1, or held-out MLM loss), first and last logged
    training loss, whether it diverged."""
    lines = logged(folder)
    losses = [line["loss"] for line in lines if "loss" in line and "eval" not in line]
    diverged = not losses or any(math.isnan(loss) for loss in losses) or losses[-1] > losses[0]
    score = None
    if kind == "multihop" and (folder / "metrics.json").is_file():
        score = json.loads((folder / "metrics.json").read_text(encoding="utf-8"))["metrics"]["f1"]
    elif kind == "mlm":
        evaluations = [line["eval"] for line in lines if "eval" in line]
        score = evaluations[-1]["mlm_loss"] if evaluations else None
    if score is not None and math.isnan(score):
        score = None
    return {"status": done["status"], "seconds": done["seconds"], "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None, "diverged": diverged, "score": score}


def talking_heads_cost(paths: dict, rounds: int) -> dict:
    """Module docstring, 3: seconds of one training step of the encoder (forward and backward on a batch
    of 8 multihop windows) with and without talking heads, residual attention off and on, the four
    models stepped in turn in one process, `rounds` times (their order turned each round), so that a
    change in the machine's load falls on all of them alike."""
    import torch

    from longdoc import GlobalLocalConfig, GlobalLocalModel
    from longdoc.analyze.data import model_inputs
    from longdoc.model_folder import read_tokenizer
    from longdoc.model.inputs import encoder_inputs
    from longdoc.tasks import REGISTRY

    tokenizer = read_tokenizer(paths["init"])
    models = {}
    for name, residual, talking in (("plain", False, False), ("talking-heads", False, True),
                                    ("residual", True, False), ("residual+talking-heads", True, True)):
        torch.manual_seed(0)
        models[name] = GlobalLocalModel(GlobalLocalConfig(vocab_size=len(tokenizer), residual_attention=residual,
                                                          talking_heads=talking, **SHAPE)).train()
    config = models["plain"].config
    config.task_options = {"max_question_len": 48}
    rows, collate = model_inputs(paths["multihop_train.json"], REGISTRY.get("multihop"), tokenizer, config, 8,
                                 progress=False)
    inputs = encoder_inputs(collate(rows))
    seconds = {name: [] for name in models}
    found = {"load_before": load(), "threads": torch.get_num_threads()}
    for round_ in range(rounds + 1):  # the first round warms up and is left out
        order = list(models) if round_ % 2 else list(reversed(models))
        for name in order:
            started = time.perf_counter()
            output = models[name](**inputs)
            (output.long_hidden_state.square().mean() + output.global_hidden_state.square().mean()).backward()
            models[name].zero_grad(set_to_none=True)
            if round_:
                seconds[name].append(time.perf_counter() - started)
    found["load_after"] = load()
    found["median"] = {name: statistics.median(values) for name, values in seconds.items()}
    found["min"] = {name: min(values) for name, values in seconds.items()}
    return found


def sweep(pool, args, paths: dict) -> dict:
    """{run name: its figures} for every kind, architecture, rate and seed (module docstring, 4)."""
    jobs = [("multihop", architecture, rate, seed, args.steps)
            for seed, rate, architecture in itertools.product(args.seeds, args.rates, args.architectures)]
    jobs += [("mlm", architecture, rate, seed, args.mlm_steps)
             for seed, rate, architecture in itertools.product(args.seeds, args.rates, args.mlm_architectures)]
    results, pending, started = {}, {}, time.perf_counter()
    for kind, architecture, rate, seed, steps in jobs:
        name = f"{kind}/{architecture}-lr{rate:g}-s{seed}"
        folder = args.out / "runs" / name
        record = args.out / "runs" / f"{name}.json"
        if record.is_file():
            results[name] = {**json.loads(record.read_text(encoding="utf-8")), "step_seconds": step_seconds(folder)}
            continue
        shutil.rmtree(folder, ignore_errors=True)
        argv = train_argv(kind, architecture, rate, seed, steps, paths, folder)
        pending[name] = (pool.submit(longdoc, argv), kind, architecture, rate, seed, folder, record)
    for name, (future, kind, architecture, rate, seed, folder, record) in pending.items():
        figures = {"kind": kind, "architecture": architecture, "rate": rate, "seed": seed,
                   **run_figures(kind, folder, future.result())}
        shutil.rmtree(folder / "checkpoints", ignore_errors=True)
        record.write_text(json.dumps(figures), encoding="utf-8")
        results[name] = {**figures, "step_seconds": step_seconds(folder)}
        print(f"[{(time.perf_counter() - started) / 60:5.1f} min, load {load()}] {name}: score {figures['score']}, "
              f"diverged {figures['diverged']}, {figures['seconds']:.0f} s", file=sys.stderr)
    return results


def layer_mean(analysis: dict, statistic: str, piece: str) -> float | None:
    found = analysis["statistics"].get(statistic, {})
    means = [entry["mean"] for entry in found.get("pieces", {}).get(piece, []) if entry["values"]]
    return statistics.fmean(means) if found.get("applicable") and means else None


def analyses(pool, args, paths: dict) -> dict:
    """{kind/architecture-lrRATE: the attention figures of its run at each of --analysis-rates, first seed}."""
    pending = {}
    for kind, architectures in (("multihop", args.architectures), ("mlm", args.mlm_architectures)):
        for architecture, rate in itertools.product(architectures, args.analysis_rates):
            name = f"{kind}/{architecture}-lr{rate:g}"
            run = args.out / "runs" / kind / f"{architecture}-lr{rate:g}-s{args.seeds[0]}"
            out = args.out / "analyses" / name
            if not (out / "analysis.json").is_file():
                shutil.rmtree(out, ignore_errors=True)
                data = ["--task", "multihop", "--data", paths["multihop_dev.json"]] if kind == "multihop" \
                    else ["--data", paths["text_dev"]]
                argv = ["analyze", "attention", "--model", run, *data, "--examples", args.analysis_examples,
                        "--out", out, "--no-plots", "--quiet"]
                pending[name] = (pool.submit(longdoc, argv), out)
            else:
                pending[name] = (None, out)
    found = {}
    for name, (future, out) in pending.items():
        if future is not None:
            future.result()
        if not (out / "analysis.json").is_file():
            found[name] = None
            continue
        analysis = json.loads((out / "analysis.json").read_text(encoding="utf-8"))
        found[name] = {heading: layer_mean(analysis, *key) for key, heading in ATTENTION.items()}
        found[name]["per_layer"] = {
            heading: [entry["mean"] for entry in analysis["statistics"][key[0]]["pieces"][key[1]]]
            for key, heading in ATTENTION.items() if analysis["statistics"][key[0]]["applicable"]}
    return found


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"


def first_losses(results: dict, kind: str) -> list[float]:
    return [run["first_loss"] for run in results.values() if run["kind"] == kind and run["first_loss"] is not None]


def cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def report(results: dict, attention: dict, cost: dict, args, minutes: float, loads: tuple[str, str]) -> str:
    lines = [f"{len(results)} runs ({args.steps} multihop steps, {args.mlm_steps} MLM steps, batch 8), "
             f"{args.workers} at a time, one thread each, on {platform.machine()}; {minutes:.0f} minutes in all; "
             f"load average {loads[0]} at the start, {loads[1]} at the end.", ""]
    for kind, architectures, heading in (("multihop", args.architectures, "held-out answer F1"),
                                         ("mlm", args.mlm_architectures, "held-out MLM loss")):
        lines += [f"{kind}: {heading}, mean ± sd over seeds {args.seeds} (diverged runs / runs)", "",
                  "| architecture | " + " | ".join(f"lr {rate:g}" for rate in args.rates) + " | diverged |",
                  "|---|" + "---|" * (len(args.rates) + 1)]
        for architecture in architectures:
            runs = [figures for figures in results.values()
                    if figures["kind"] == kind and figures["architecture"] == architecture]
            cells = [spread([run["score"] for run in runs if run["rate"] == rate and run["score"] is not None])
                     for rate in args.rates]
            lines.append(f"| {architecture} | " + " | ".join(cells) +
                         f" | {sum(run['diverged'] for run in runs)}/{len(runs)} |")
        lines += ["", f"{kind}: last logged training loss (first logged: {spread(first_losses(results, kind))}), "
                  "mean ± sd over seeds, diverged runs in brackets", "",
                  "| architecture | " + " | ".join(f"lr {rate:g}" for rate in args.rates) + " |",
                  "|---|" + "---|" * len(args.rates)]
        for architecture in architectures:
            cells = []
            for rate in args.rates:
                runs = [figures for figures in results.values() if figures["kind"] == kind
                        and figures["architecture"] == architecture and figures["rate"] == rate]
                finite = [run["last_loss"] for run in runs if run["last_loss"] is not None
                          and not math.isnan(run["last_loss"])]
                diverged = sum(run["diverged"] for run in runs)
                cells.append(spread(finite) + (f" ({diverged})" if diverged else ""))
            lines.append(f"| {architecture} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += [f"Attention (runs of seed {args.seeds[0]}; means over layers of each layer's "
              "mean over heads and queries)", "", "| run | " + " | ".join(ATTENTION.values()) + " |",
              "|---|" + "---|" * len(ATTENTION)]
    for name, figures in attention.items():
        lines.append(f"| {name} | " + " | ".join(cell(figures and figures[heading]) for heading in ATTENTION.values())
                     + " |")
    lines += ["", "Per layer:", ""]
    for name, figures in attention.items():
        for heading, means in (figures or {}).get("per_layer", {}).items():
            lines.append(f"- {name}, {heading}: " + " ".join(f"{mean:.3f}" for mean in means))
    lines += ["", f"Talking heads' cost: encoder forward + backward, batch of 8 multihop windows, {args.timing_rounds} "
              f"steps of each model in turn, alone, {cost['threads']} thread(s); load average {cost['load_before']} "
              f"before, {cost['load_after']} after", "", "| model | median s/step | min s/step | median x plain |",
              "|---|---|---|---|"]
    lines += [f"| {name} | {cost['median'][name]:.4f} | {cost['min'][name]:.4f} | "
              f"{cost['median'][name] / cost['median']['plain']:.2f} |" for name in cost["median"]]
    lines += ["", "Seconds per training step in the sweep (median over each run's logged intervals, all rates and "
              "seeds; runs two at a time beside other jobs):", ""]
    for kind in ("multihop", "mlm"):
        for architecture in ARCHITECTURES:
            values = [run["step_seconds"] for run in results.values()
                      if run["kind"] == kind and run["architecture"] == architecture and run.get("step_seconds")]
            if values:
                lines.append(f"- {kind} {architecture}: {statistics.median(values):.3f}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("study"),
                        help="working folder (default ./study); reruns resume")
    parser.add_argument("--steps", type=int, default=120, help="optimizer steps of every multihop run (default 120)")
    parser.add_argument("--mlm-steps", type=int, default=40, help="optimizer steps of every MLM run (default 40)")
    parser.add_argument("--rates", type=float, nargs="+", default=list(RATES), help="peak learning rates")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="training seeds (default 0 1 2)")
    parser.add_argument("--architectures", nargs="+", default=list(ARCHITECTURES), choices=ARCHITECTURES,
                        help="multihop architectures (default: all)")
    parser.add_argument("--mlm-architectures", nargs="*", choices=ARCHITECTURES,
                        default=["plain", "residual", "residual-mean", "talking-heads"],
                        help="MLM architectures (default: plain residual residual-mean talking-heads)")
    parser.add_argument("--analysis-rates", type=float, nargs="+", default=[1e-3, 3e-3],
                        help="the rates whose runs (first seed) are analysed (default 1e-3 3e-3)")
    parser.add_argument("--analysis-examples", type=int, default=16, help="inputs each analysis reads (default 16)")
    parser.add_argument("--timing-rounds", type=int, default=30, help="steps of each model in the talking-heads "
                        "timing (default 30)")
    parser.add_argument("--workers", type=int, default=2, help="runs at a time, one thread each (default 2)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")  # before any worker imports torch
    started, load_at_start = time.time(), load()
    context = get_context("spawn")  # workers import torch afresh (no fork of a running thread pool)
    with ProcessPoolExecutor(1, mp_context=context, initializer=_worker_start) as alone:
        paths = alone.submit(prepare, args.out).result()
        cost_file = args.out / "talking_heads_cost.json"
        if not cost_file.is_file():
            cost = alone.submit(talking_heads_cost, paths, args.timing_rounds).result()
            cost_file.write_text(json.dumps(cost), encoding="utf-8")
    cost = json.loads(cost_file.read_text(encoding="utf-8"))
    print(f"[load {load()}] talking heads' cost: {cost['median']}", file=sys.stderr)
    with ProcessPoolExecutor(args.workers, mp_context=context, initializer=_worker_start) as pool:
        results = sweep(pool, args, paths)
        attention = analyses(pool, args, paths)
    text = report(results, attention, cost, args, (time.time() - started) / 60, (load_at_start, load()))
    (args.out / "results.json").write_text(json.dumps({"runs": results, "attention": attention, "cost": cost},
                                                      indent=1), encoding="utf-8")
    (args.out / "report.md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
