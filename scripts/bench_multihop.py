"""Learning on the built-in multi-hop task: held-out answer F1 against training minutes.

Documents of --length wordpieces (default 2048) with the two facts of every question more than
--min-distance wordpieces apart (default 1025, i.e. more than 1024); three runs of `longdoc train
multihop` on the same data and options (tasks/multihop/configs/bench.json), each stopped after
--minutes of training (evaluation excluded) and evaluated on the held-out file every --eval-steps:
the lifted MiniLM with RealFormer residual attention on, the same with it off, and the same model
(residual on) reading only the first 512 wordpieces of every document. Writes to --out:
curves.json (every evaluation, every metric), curves.md (the table) and curves.png (the plot;
needs matplotlib: pip install -e ".[plot]"). Beside the curves, what guessing scores on the same
held-out files (`guessing_f1`: a "based in" city of the document for a bridge question, a coin for
yes/no): the level a run that has not found the bridge stays at.

Every run starts from the MiniLM lifted with --positions (default absolute: MiniLM's own position
table tiled, Longformer's initialisation). ETC's relative tables start fresh when lifted and the
model has to learn word order from the task: on this task at 512 wordpieces, 100 steps of 2 x 2
gave held-out answer F1 0.15 from the relative lift against 0.50 from the absolute one (on data of
the generator before it levelled its cities, where guessing scored 0.51: the absolute lift learned
sooner to read a "based in" city).

    python scripts/bench_multihop.py --out bench-multihop --minutes 30
"""

import argparse
import sys
from pathlib import Path

from longdoc.errors import InputError
from longdoc.io import atomic_write_json, atomic_write_text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's benchmarks/ package

GUESSING = "a 'based in' city of the document for a bridge question, a coin for yes/no"
RUNS = (  # name, residual attention, reads only the first --restricted-length wordpieces
    ("residual on", True, False),
    ("residual off", False, False),
    ("first {restricted}, residual on", True, True),
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-multihop"), help="data, runs and the curves")
    parser.add_argument("--minutes", type=float, default=30.0, help="training minutes per run (default 30)")
    parser.add_argument("--config", default="bench", help="training options of every run (default: multihop 'bench')")
    parser.add_argument("--eval-steps", type=int, help="evaluate every N steps (default: the config's)")
    parser.add_argument("--max-steps", type=int,
                        help="steps of the learning-rate schedule (default: the config's); a run stops at the "
                             "earlier of --minutes and this")
    parser.add_argument("--train-examples", type=int, default=2000)
    parser.add_argument("--dev-examples", type=int, default=100)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--min-distance", type=int, default=1025)
    parser.add_argument("--restricted-length", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--positions", choices=("relative", "absolute", "both"), default="absolute",
                        help="position scheme of the lifted MiniLM every run starts from (default: absolute)")
    return parser.parse_args(argv)


def table(curves: dict[str, list[dict]], guessing: dict[str, float]) -> str:
    """The curves as a markdown table, then what guessing scores on the full and the cut dev file."""
    from longdoc.evaluate.tables import markdown_table

    rows = [[name, str(point["step"]), f"{point['minutes']:.1f}", f"{point['metrics']['f1']:.4f}",
             f"{point['metrics']['em']:.4f}"]
            for name, points in curves.items() for point in points]
    lines = [markdown_table(["run", "step", "training minutes", "answer F1", "answer EM"], rows), ""]
    lines += [f"guessing ({GUESSING}), {name}: answer F1 {f1:.4f}" for name, f1 in guessing.items()]
    return "\n".join(lines)


def plot(curves: dict[str, list[dict]], guessing: float, path: Path, title: str) -> bool:
    try:
        import matplotlib
    except ImportError:
        print('bench_multihop: matplotlib is not installed (pip install -e ".[plot]"): no plot', file=sys.stderr)
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    for name, points in curves.items():
        axes.plot([p["minutes"] for p in points], [p["metrics"]["f1"] for p in points], marker="o", label=name)
    axes.axhline(guessing, color="grey", linestyle="--", label="guessing (full documents)")
    axes.set_xlabel("training minutes")
    axes.set_ylabel("held-out answer F1")
    axes.set_ylim(0, 1)
    axes.set_title(title, fontsize=9)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    staging = path.with_name(f".{path.name}.tmp.png")
    figure.savefig(staging, dpi=120)
    staging.replace(path)
    return True


def main(argv=None) -> int:
    from dataclasses import asdict

    from longdoc.model_folder import read_tokenizer
    from longdoc.convert.pretrained import default_model_path, lifted_minilm
    from longdoc.cpu_memory import configure_allocator
    from benchmarks.multihop import timed_training
    from longdoc.demo import DemoData, write_data
    from longdoc.io import read_json
    from longdoc.tasks.multihop import generator
    from longdoc.tasks.multihop.generator import RELATION_SHARE, guessing_f1
    from longdoc.tasks import get_task
    from longdoc.train.options import recorded_options, resolve_task_options

    args = parse_args(argv)
    configure_allocator()  # as the `longdoc` command: freed memory kept (longdoc/cpu_memory.py)
    try:  # The full multi-hop setting (the generator's defaults), not the demo's easier one.
        data = DemoData(train_examples=args.train_examples, dev_examples=args.dev_examples, length=args.length,
                        min_distance=args.min_distance, restricted_length=args.restricted_length, seed=args.seed,
                        comparison_fraction=0.2, relation_share=RELATION_SHARE, chain_order=False)
    except InputError as error:
        print(f"bench_multihop: error: {error}", file=sys.stderr)
        return 2
    (args.out / "data").mkdir(parents=True, exist_ok=True)
    paths = write_data(args.out / "data", data, read_tokenizer(default_model_path()), generator)
    guessing = {"full documents": guessing_f1(read_json(paths["dev"])),
                f"first {data.restricted_length}": guessing_f1(read_json(paths["dev-restricted"]))}
    task = get_task("multihop")
    init = lifted_minilm(positions=args.positions, long_max_len=max(4096, data.length))
    curves, run_options_used = {}, {}
    for name, residual, restricted in RUNS:
        name = name.format(restricted=data.restricted_length)
        given = {"train": paths["train-restricted" if restricted else "train"],
                 "dev": paths["dev-restricted" if restricted else "dev"],
                 "out": args.out / name.replace(",", "").replace(" ", "-"), "init": init,
                 "residual_attention": residual,
                 "long_max_len": data.restricted_length if restricted else data.length,
                 "eval_steps": args.eval_steps, "max_steps": args.max_steps}
        options, task_options = resolve_task_options(task, given, args.config)
        print(f"bench_multihop: {name}: {args.minutes:g} training minutes in {given['out']}", file=sys.stderr)
        run_options_used[name] = recorded_options(options, task_options)
        curves[name] = [asdict(point) for point in timed_training(task, options, task_options, args.minutes)]
        atomic_write_json(args.out / "curves.json", {"data": asdict(data), "positions": args.positions,
                                                     "minutes": args.minutes, "options": run_options_used,
                                                     "guessing_f1": guessing, "curves": curves})
    text = table(curves, guessing)
    atomic_write_text(args.out / "curves.md", text + "\n")
    print(text)
    title = (f"multihop: {data.length}-wordpiece documents, facts > {data.min_distance - 1} apart, "
             f"{data.dev_examples} held-out, {args.positions} positions")
    if plot(curves, guessing["full documents"], args.out / "curves.png", title):
        print(f"bench_multihop: plot in {args.out / 'curves.png'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
