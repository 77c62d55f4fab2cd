"""`torchrun` prediction's throughput on the CPU: a generated multi-hop set of mixed lengths (100
examples each of 256, 512, 1024 and 2048 wordpieces, shuffled: 400) predicted by a random HotpotQA
model (hidden 128, 4 layers, windows of 512; its answers mean nothing) with `torchrun
--nproc_per_node 2` of one thread each, and with one `longdoc predict` of two threads, alternated
round by round. Prints each run's examples per second and the load average at its start, the ratio
of the two (target: at least 0.9x) and how far the slowest process's model seconds are from the
fastest's (target: within 10%); checks that the runs' files are byte-identical.

  python scripts/bench_predict_torchrun.py [--folder DIR] [--rounds 2] [--per-length 100]

Run it on a quiet machine: under load, two threads in one process wait on each other.
"""

import argparse
import filecmp
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

LENGTHS = (256, 512, 1024, 2048)


def make_data(folder: Path, per_length: int) -> Path:
    """The mixed set, from `longdoc make-data multihop` at each length (seeded by it), shuffled (seed 0)."""
    examples = []
    for length in LENGTHS:
        part = folder / f"mh{length}.json"
        subprocess.run([sys.executable, "-m", "longdoc.cli", "--quiet", "make-data", "multihop", "--n", str(per_length),
                        "--length", str(length), "--seed", str(length), "--out", str(part)], check=True,
                       stderr=subprocess.DEVNULL)
        examples += json.loads(part.read_text(encoding="utf-8"))
    random.Random(0).shuffle(examples)
    data = folder / f"mixed{len(examples)}.json"
    data.write_text(json.dumps(examples), encoding="utf-8")
    return data


def make_model(folder: Path) -> Path:
    import torch
    from transformers.utils import logging

    from longdoc.convert.pretrained import default_tokenizer
    from longdoc.model.config import GlobalLocalConfig
    from longdoc.model.pretrained import GlobalLocalModel
    from longdoc.tasks import get_task

    logging.disable_progress_bar()
    tokenizer = default_tokenizer()
    torch.manual_seed(0)
    GlobalLocalModel(GlobalLocalConfig(vocab_size=tokenizer.vocab_size, hidden_size=128, num_hidden_layers=4,
                                       num_attention_heads=2, intermediate_size=512, long_max_len=512,
                                       global_max_len=256)).save_pretrained(folder / "encoder")
    torch.manual_seed(0)
    get_task("hotpotqa").load("model").from_encoder(folder / "encoder").save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    return folder / "model"


def predict(processes: int, threads: int, model: Path, data: Path, out: Path) -> dict:
    """One run's --json summary, with the load average at its start."""
    load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
    argv = ["--quiet", "predict", "hotpotqa", "--model", str(model), "--data", str(data), "--out", str(out), "--json"]
    if processes > 1:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
                   "-m", "longdoc.cli", *argv]
    else:
        command = [sys.executable, "-m", "longdoc.cli", *argv]
    run = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": str(threads)}, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{run.stderr[-3000:]}")
    return {**json.loads(run.stdout.strip().splitlines()[-1]), "load": load}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, help="where the data, model and predictions go (default: a temporary folder)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both runs, alternated (default 2)")
    parser.add_argument("--per-length", type=int, default=100, help="examples per length (default 100)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as temporary:
        folder = args.folder or Path(temporary)
        folder.mkdir(parents=True, exist_ok=True)
        data, model = make_data(folder, args.per_length), make_model(folder)
        first = None
        for round_ in range(1, args.rounds + 1):
            runs = {}
            for name, processes, threads in (("2 processes x 1 thread", 2, 1), ("1 process x 2 threads", 1, 2)):
                out = folder / f"round{round_}-{processes}x{threads}" / "pred.json"
                out.parent.mkdir(exist_ok=True)
                runs[name] = summary = predict(processes, threads, model, data, out)
                first = first or out
                same = all(filecmp.cmp(first.with_name(first.name + suffix), out.with_name(out.name + suffix),
                                       shallow=False) for suffix in ("", ".scores.jsonl"))
                print(f"round {round_}, {name} (load {summary['load']}): {summary['examples']} examples "
                      f"({summary['windows']} windows) in {summary['seconds']} s, {summary['examples_per_second']} "
                      f"examples/s; files {'byte-identical to the first run' if same else 'DIFFER from the first run'}")
                if not same:
                    return 1
            two, one = runs["2 processes x 1 thread"], runs["1 process x 2 threads"]
            seconds = [share["seconds"] for share in two["processes"]]
            print(f"round {round_}: throughput of 2 processes / 1 process of 2 threads "
                  f"{two['examples_per_second'] / one['examples_per_second']:.2f}x (target >= 0.9x); processes' "
                  f"model seconds {' / '.join(f'{s:.1f}' for s in seconds)}: slowest "
                  f"{(max(seconds) / min(seconds) - 1) * 100:.1f}% over the fastest (target <= 10%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
