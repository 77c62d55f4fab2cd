"""`longdoc bench`: the encoder benchmark table (or JSON); the work is in longdoc.bench."""

import argparse
import json
import sys

from longdoc.model import inference
from longdoc.commands.model_flags import add_attention_argument, add_compile_argument
from longdoc.errors import InputError

HELP = "time and measure the memory of the encoder next to Longformer, BigBird and BERT"
PROFILE_LENGTHS = (4096,)


def _lengths(text: str) -> tuple:
    try:
        lengths = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if any(length <= 0 for length in lengths):
        raise argparse.ArgumentTypeError(f"lengths must be positive, got {text!r}")
    return lengths


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = "exit status: 1 when a measurement fails, 0 otherwise, 2 for bad options"
    parser.add_argument("--quick", action="store_true", help="1k and 4k long tokens, one repeat (two with --plain), "
                        "ours(res) (and ours(res,th) with --plain) and the peers")
    parser.add_argument(
        "--plain", action="store_true",
        help="measure every model interleaved in this one plain process, as a user's script runs them, each peer "
        "reading the same L-token document (default: each measurement in a fresh process, peers reading L + 256)",
    )
    parser.add_argument(
        "--batched", action="store_true",
        help="instead: examples/s of our forward at batch sizes 1, 4, 16 and 512, 2048, 4096 tokens, in this process",
    )
    parser.add_argument(
        "--profile", action="store_true",
        help="instead: where a forward and a forward+backward spend their time (projections, each softmax, "
        "feed-forward, layer norms, glue), ms and share, for ours(res) and BERT with SDPA in this process, at "
        "each --lengths (default 4096)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--lengths", type=_lengths, help="comma-separated long-token lengths (default 1024,...,16384)")
    parser.add_argument("--repeats", type=_positive, help="timed repeats after the warm-up (default 3; 1 with --quick)")
    parser.add_argument("--no-peers", action="store_true", help="run only our encoder")
    parser.add_argument("--threads", type=_positive, help="torch threads in each measuring process (default: one per core)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--shape", choices=("minilm", "base", "large"), default="minilm",
                        help="every model's transformer shape, from our presets: minilm (6 layers, hidden 384; the "
                        "default), base (ETC-base: 12 layers, hidden 768) or large (24 layers, hidden 1024)")
    add_attention_argument(parser)
    add_compile_argument(parser)
    parser.add_argument(
        "--allocator", choices=("auto", "jemalloc", "keep", "thp", "system"),
        help="memory allocator of every fresh measuring process (see longdoc/cpu_memory.py): jemalloc keeping "
        "freed pages, glibc keeping freed memory (the library's own setting), transparent huge pages, or the "
        "system's defaults; auto (the default): jemalloc where installed, else keep. Not with --plain/--batched, "
        "which run under what importing longdoc sets (LONGDOC_ALLOCATOR)",
    )


def _print_progress(measurement) -> None:
    if measurement.error:
        outcome = f"failed: {measurement.error}"
    else:
        outcome = f"{measurement.median_seconds:.3f} s"
        if measurement.peak_mib is not None:
            outcome += f", {measurement.peak_mib:.0f} MiB"
    print(f"  {measurement.model} L={measurement.length} {measurement.mode}: {outcome}", file=sys.stderr, flush=True)


def settings_from_arguments(args: argparse.Namespace):
    """BenchSettings for the parsed arguments: --quick's defaults, then any explicit option."""
    from longdoc.bench import BenchSettings
    from longdoc.bench.settings import FULL_LENGTHS, OURS_PLAIN, OURS_RESIDUAL, OURS_RESIDUAL_TALKING, PEERS, Shape
    from longdoc.cpu_memory import KEEP, allocator_environment, resolve_allocator

    in_process = args.plain or args.batched or args.profile
    if in_process and args.allocator:
        raise InputError("--allocator sets the fresh processes' allocator; --plain, --batched and --profile run in this "
                         "process, under what importing longdoc sets (LONGDOC_ALLOCATOR=keep or system)")
    try:
        allocator = KEEP if in_process else resolve_allocator(args.allocator or "auto")
        allocator_environment(allocator)
    except ValueError as error:
        raise InputError(f"--allocator: {error}") from None
    overrides = dict(dtype=args.dtype, device=args.device, allocator=allocator, threads=args.threads or 0,
                     attention=args.attention or "auto", shape=Shape.from_preset(args.shape), compile=args.compile)
    # The peers' length limit keeps the default sweep's minutes on the CPU: lengths named with --lengths
    # run the peers too, and on a GPU its memory decides (OOM rows).
    if args.device == "cuda" or args.lengths:
        overrides["peer_max_length"] = max(args.lengths or FULL_LENGTHS)
    if args.lengths:
        overrides["lengths"] = args.lengths
    if args.repeats:
        overrides["repeats"] = args.repeats
    if args.plain:
        if args.quick:
            settings = BenchSettings.plain_quick(**overrides)
        else:
            # On a GPU also ours without residual attention: what keeping every layer's scores costs
            # where the peers' fused attention keeps none.
            ours = (OURS_RESIDUAL, OURS_PLAIN) if args.device == "cuda" else (OURS_RESIDUAL,)
            variants = ours + (OURS_RESIDUAL_TALKING,) + PEERS
            settings = BenchSettings(**{"variants": variants, "plain_process": True, **overrides})
    else:
        settings = BenchSettings.quick(**overrides) if args.quick else BenchSettings(**overrides)
    return settings.without_peers() if args.no_peers else settings


def check_device(args: argparse.Namespace) -> None:
    """InputError when --device, --attention or --compile cannot run on this machine."""
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: torch finds no CUDA device on this machine")
    compile_refusal = inference.compile_refusal(torch.device(args.device)) if args.compile else None
    if compile_refusal is not None:
        raise InputError(f"--compile: {compile_refusal}")
    if args.attention is not None:
        inference.check_attention(args.attention, torch.device(args.device), getattr(torch, args.dtype),
                                  f"--attention {args.attention}")


def measure(args: argparse.Namespace):
    """The BenchResult of the fresh-process run, or with --plain the in-process one, that the parsed
    arguments ask for; each measurement told on stderr as it comes."""
    from longdoc.bench import run_benchmark
    from longdoc.bench.plain import run_plain

    return (run_plain if args.plain else run_benchmark)(settings_from_arguments(args), progress=_print_progress)


def _profile(args: argparse.Namespace) -> int:
    from longdoc.bench.profile import describe_machine, profile_json, profiled_variants, render_profile, run_profile

    if args.batched or args.plain:
        raise InputError("--profile runs on its own: not with --plain or --batched")
    settings = settings_from_arguments(args)
    machine = describe_machine(settings)
    reports = []
    for length in args.lengths or PROFILE_LENGTHS:
        profiles = run_profile(settings, length, profiled_variants(settings))
        reports.append(profile_json(profiles, length, settings, machine) if args.json
                       else render_profile(profiles, length, settings, machine))
    print(json.dumps(reports, indent=2) if args.json else "\n\n".join(reports))
    return 0


def run(args: argparse.Namespace) -> int:
    from longdoc.bench import render_table, to_json
    from longdoc.bench.plain import BATCH_LENGTHS, render_batched, run_batched

    check_device(args)
    if args.profile:
        return _profile(args)
    if args.batched:
        settings = settings_from_arguments(args)
        rows = run_batched(settings, lengths=args.lengths or BATCH_LENGTHS, progress=lambda row: print(
            f"  L={row.length} batch {row.batch_size}: {row.examples_per_second:.2f} examples/s", file=sys.stderr, flush=True
        ))
        if args.json:
            print(json.dumps([{**vars(row), "examples_per_second": row.examples_per_second} for row in rows], indent=2))
        else:
            print(render_batched(rows, settings))
        return 0
    result = measure(args)
    print(json.dumps(to_json(result), indent=2) if args.json else render_table(result))
    return 1 if any(measurement.error for measurement in result.measurements) else 0
