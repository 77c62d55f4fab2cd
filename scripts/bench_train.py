"""Training-step benchmark: the HotpotQA task model against transformers' BigBirdForQuestionAnswering and
LongformerForQuestionAnswering of the same shape, each taking the engine's own optimizer step.

    python scripts/bench_train.py [--length 4096] [--repeats 3] [--rounds 1] [--threads N] [--json FILE]

What is timed, per model and with / without gradient checkpointing, each in a fresh process (so a
peak-memory reading sees only its own model; longdoc.bench.memory.PeakMemory, allocator set by
longdoc.cpu_memory as in `longdoc bench`): `longdoc.train.engine.optimizer_step` on one example
(forward with the task loss, backward, gradient clipping, AdamW, the schedule), one warm-up step
then `--repeats` timed steps. With `--rounds R` the six measurements run R times in turn
(round-robin), so that load from other jobs falls on every model alike. Reported: the fastest step
(the one least disturbed by other work on a shared machine; the targets compare these) and the
median step over all rounds. Peak memory covers the warm-up (which allocates AdamW's moments) and
the timed steps, above the level once model and batch exist (the largest over rounds).

Inputs: one synthetic HotpotQA example (ten paragraphs of common single-wordpiece words) run
through the HotpotQA task's own feature builder with the MiniLM tokenizer, so our model gets a real
window: `--length` long tokens and one global token per question wordpiece, paragraph and sentence.
The peers read the same `--length` long tokens (the same ids) and the same span labels; Longformer
gets global attention on the question tokens (its QA setting), BigBird runs block-sparse.
Shape (MiniLM): 6 layers, hidden 384, 12 heads, FFN 1536, vocabulary 30522, dropout 0.1 (training).
Peer attention as in `longdoc bench`: Longformer window 512 (both sides), BigBird blocks of 64 with
3 random blocks; ours: local radius 84 (ETC-base).
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

MODELS = ("ours", "bigbird", "longformer")
SHAPE = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
LOCAL_RADIUS = 84
GLOBAL_TOKENS = 256
LONGFORMER_WINDOW = 512
BIGBIRD_BLOCK, BIGBIRD_RANDOM_BLOCKS = 64, 3
# Common English words that are one wordpiece each in MiniLM's uncased vocabulary.
WORDS = ("the city river north south east west town house school church party music film album game team "
         "club season league player coach state county village island lake mountain road bridge station "
         "company group band song book novel author actor writer singer king queen army war battle").split()
SENTENCE_WORDS = 24
SENTENCES_PER_PARAGRAPH = 18


def synthetic_example(seed: int) -> dict:
    """One HotpotQA-format example whose ten paragraphs fill more than one 4096-token window."""
    import random

    generator = random.Random(seed)
    context = []
    for paragraph in range(10):
        sentences = [" ".join(generator.choice(WORDS) for _ in range(SENTENCE_WORDS)) + ". "
                     for _ in range(SENTENCES_PER_PARAGRAPH)]
        context.append([f"title {paragraph}", sentences])
    answer = " ".join(context[0][1][3].split()[2:4])
    return {"_id": "bench", "question": "which " + " ".join(generator.choice(WORDS) for _ in range(14)) + "?",
            "answer": answer, "supporting_facts": [["title 0", 3], ["title 1", 5]], "context": context,
            "type": "bridge", "level": "hard"}


def hotpotqa_batch(length: int, seed: int):
    """The first training window of the synthetic example, collated by the HotpotQA task's own code."""
    import torch

    from longdoc.convert.pretrained import default_tokenizer
    from longdoc.model.config import GlobalLocalConfig
    from longdoc.tasks import get_task

    task = get_task("hotpotqa")
    features, model_class = task.load("features"), task.load("model")
    config = GlobalLocalConfig(**SHAPE, long_max_len=length, global_max_len=GLOBAL_TOKENS, local_radius=LOCAL_RADIUS)
    config.task_options = dict(model_class.default_task_options)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bench.json"
        path.write_text(json.dumps([synthetic_example(seed)]))
        rows = features.training_features(path, default_tokenizer(), config, None)
    torch.manual_seed(seed)
    return model_class(config), features.collate(rows[:1], config.pad_token_id)


def peer_model(name: str, length: int, batch: dict):
    """BigBird or Longformer for QA, the same shape, on the same long tokens and span labels."""
    import torch

    ids = batch["long_input_ids"]
    labels = dict(start_positions=batch["start_positions"].clamp(min=0), end_positions=batch["end_positions"].clamp(min=0))
    common = dict(**SHAPE, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    if name == "bigbird":
        from transformers import BigBirdConfig, BigBirdForQuestionAnswering

        # sep_token_id: BigBird's QA model finds the question's end at the first [SEP] (MiniLM's id).
        config = BigBirdConfig(**common, attention_type="block_sparse", block_size=BIGBIRD_BLOCK,
                               num_random_blocks=BIGBIRD_RANDOM_BLOCKS, max_position_embeddings=max(length, 4096),
                               pad_token_id=0, sep_token_id=102)
        return BigBirdForQuestionAnswering(config), dict(input_ids=ids, **labels)
    from transformers import LongformerConfig, LongformerForQuestionAnswering

    padded = -(-length // LONGFORMER_WINDOW) * LONGFORMER_WINDOW
    # RoBERTa-style positions start after the padding id (1), hence the extra entries.
    config = LongformerConfig(**common, attention_window=LONGFORMER_WINDOW, pad_token_id=1,
                              max_position_embeddings=padded + 2)
    question = int((ids[0] == 102).nonzero()[0]) + 1  # [CLS] question [SEP]
    global_attention_mask = torch.zeros_like(ids)
    global_attention_mask[:, :question] = 1
    return LongformerForQuestionAnswering(config), dict(input_ids=ids, global_attention_mask=global_attention_mask,
                                                        **labels)


def measure(request: dict) -> dict:
    """One (model, gradient checkpointing) measurement in this process."""
    from longdoc.cpu_memory import configure_allocator

    configure_allocator()
    import torch

    from longdoc.bench.memory import PeakMemory
    from longdoc.train.engine import build_optimizer, enable_gradient_checkpointing, linear_schedule, optimizer_step

    if request.get("threads"):
        torch.set_num_threads(request["threads"])
    torch.manual_seed(request["seed"])
    model, batch = hotpotqa_batch(request["length"], request["seed"])
    long_tokens, global_tokens = batch["long_input_ids"].shape[1], batch["global_input_ids"].shape[1]
    if request["model"] != "ours":
        model, batch = peer_model(request["model"], request["length"], batch)
    if request["gradient_checkpointing"]:
        enable_gradient_checkpointing(model)
    model.train()
    optimizer = build_optimizer(model, lr=3e-5, weight_decay=0.01)
    scheduler = linear_schedule(optimizer, 0, 1000)
    times, losses = [], []
    with PeakMemory("cpu") as peak:
        for _ in range(1 + request["repeats"]):
            start = time.perf_counter()
            loss, _ = optimizer_step(model, lambda micro: batch, 1, optimizer, scheduler, 1.0)
            times.append(time.perf_counter() - start)
            losses.append(float(loss))
    median = statistics.median(times[1:])
    return {**request, "long_tokens": long_tokens, "global_tokens": global_tokens if request["model"] == "ours" else 0,
            "parameters": sum(p.numel() for p in model.parameters()), "step_seconds": times[1:],
            "median_seconds": median, "examples_per_second": 1 / median, "peak_mib": peak.peak_mib,
            "losses": losses, "threads": torch.get_num_threads()}


def run_worker(request: dict) -> dict:
    completed = subprocess.run([sys.executable, __file__, "--worker", json.dumps(request)], capture_output=True,
                               text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if completed.returncode != 0:
        reason = (completed.stderr.strip().splitlines() or ["exit status %d" % completed.returncode])[-1]
        return {**request, "error": reason}
    return json.loads(completed.stdout.strip().splitlines()[-1])


def merge_rounds(measurements: list[dict]) -> dict:
    """One row per (model, checkpointing) from its measurements in every round."""
    failed = [m for m in measurements if "error" in m]
    if failed:
        return failed[0]
    steps = [seconds for m in measurements for seconds in m["step_seconds"]]
    fastest = min(steps)
    return {**measurements[0], "step_seconds": steps, "fastest_seconds": fastest,
            "median_seconds": statistics.median(steps), "examples_per_second": 1 / fastest,
            "peak_mib": max(m["peak_mib"] for m in measurements), "rounds": len(measurements)}


def table(results: list[dict]) -> str:
    lines = ["| model | gradient checkpointing | long + global tokens | fastest step s | median step s | examples/s "
             "(fastest) | peak MiB | ours' speed-up |", "|---|---|---|---|---|---|---|---|"]
    ours = {r["gradient_checkpointing"]: r for r in results if r["model"] == "ours" and "error" not in r}
    for r in results:
        checkpointing = "on" if r["gradient_checkpointing"] else "off"
        if "error" in r:
            lines.append(f"| {r['model']} | {checkpointing} | | failed: {r['error']} | | | | |")
            continue
        mine = ours.get(r["gradient_checkpointing"])
        speedup = f"{r['fastest_seconds'] / mine['fastest_seconds']:.2f}x" if mine and r["model"] != "ours" else ""
        lines.append(f"| {r['model']} | {checkpointing} | {r['long_tokens']} + {r['global_tokens']} | "
                     f"{r['fastest_seconds']:.2f} | {r['median_seconds']:.2f} | {r['examples_per_second']:.3f} | "
                     f"{r['peak_mib']:.0f} | {speedup} |")
    return "\n".join(lines)


def checks(results: list[dict]) -> list[str]:
    lines = []
    for checkpointing in (False, True):
        row = {r["model"]: r for r in results if r["gradient_checkpointing"] == checkpointing}
        for peer in MODELS[1:]:
            label = f"ours faster than {peer} (gradient checkpointing {'on' if checkpointing else 'off'})"
            if "error" in row["ours"] or "error" in row[peer]:
                lines.append(f"SKIP {label}: a measurement failed")
            else:
                faster = row["ours"]["fastest_seconds"] < row[peer]["fastest_seconds"]
                lines.append(f"{'PASS' if faster else 'FAIL'} {label}: {row['ours']['fastest_seconds']:.2f} s vs "
                             f"{row[peer]['fastest_seconds']:.2f} s")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=4096, help="long tokens (default 4096)")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per measurement (default 3)")
    parser.add_argument("--rounds", type=int, default=1, help="times every measurement runs, in turn (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, help="torch threads per measuring process (default: torch's choice)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write every measurement as JSON")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(measure(json.loads(args.worker))))
        return 0
    models = [name for name in args.models.split(",") if name]
    unknown = set(models) - set(MODELS)
    if unknown or args.repeats < 1 or args.rounds < 1:
        parser.error(f"unknown model(s) {', '.join(sorted(unknown))}" if unknown else "--repeats and --rounds must be >= 1")
    plan = [(name, checkpointing) for checkpointing in (False, True) for name in models]
    measured: dict[tuple, list[dict]] = {key: [] for key in plan}
    for round_number in range(1, args.rounds + 1):
        for name, checkpointing in plan:
            request = {"model": name, "gradient_checkpointing": checkpointing, "length": args.length,
                       "repeats": args.repeats, "seed": args.seed, "threads": args.threads}
            print(f"round {round_number}/{args.rounds}: {name}, gradient checkpointing "
                  f"{'on' if checkpointing else 'off'} ...", file=sys.stderr)
            measured[(name, checkpointing)].append(run_worker(request))
    results = [merge_rounds(measured[key]) for key in plan]
    print(table(results))
    if set(models) == set(MODELS):
        print("\n" + "\n".join(checks(results)))
    if args.json:
        from longdoc.io import atomic_write_json

        atomic_write_json(args.json, {"cpu_count": os.cpu_count(), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
