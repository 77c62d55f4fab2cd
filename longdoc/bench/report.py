"""The benchmark's output: a table on screen, or one JSON object with everything a reader needs to
re-check it (settings, machine, matmul baseline, every measurement, the table's rows)."""

from dataclasses import asdict, dataclass

from longdoc.bench.results import BenchResult, Measurement
from longdoc.bench.settings import FORWARD, REFERENCE, TRAIN


@dataclass(frozen=True)
class Row:
    """One (model, length): its two modes side by side, times as ratios to the reference variant's."""

    model: str
    length: int
    forward_seconds: float | None
    train_seconds: float | None
    forward_peak_mib: float | None
    train_peak_mib: float | None
    forward_ratio: float | None
    train_ratio: float | None
    gflops: float | None
    matmul_fraction: float | None


def _ratio(measurement: Measurement | None, reference: Measurement | None) -> float | None:
    if measurement is None or reference is None:
        return None
    return measurement.median_seconds / reference.median_seconds


def table_rows(result: BenchResult) -> list[Row]:
    """Rows by length, then in the order of the run's variants; a model not run at a length has none."""
    rows = []
    measured = {(m.model, m.length) for m in result.measurements}
    for length in result.settings.lengths:
        for variant in result.settings.variants:
            if (variant.name, length) not in measured:
                continue
            forward = result.find(variant.name, length, FORWARD)
            train = result.find(variant.name, length, TRAIN)
            gflops = forward.gflops if forward else None
            rows.append(Row(
                model=variant.name,
                length=length,
                forward_seconds=forward.median_seconds if forward else None,
                train_seconds=train.median_seconds if train else None,
                forward_peak_mib=forward.peak_mib if forward else None,
                train_peak_mib=train.peak_mib if train else None,
                forward_ratio=_ratio(forward, result.find(REFERENCE.name, length, FORWARD)),
                train_ratio=_ratio(train, result.find(REFERENCE.name, length, TRAIN)),
                gflops=gflops,
                matmul_fraction=gflops / result.matmul.gflops if gflops else None,
            ))
    return rows


def _cell(value: float | None, pattern: str) -> str:
    return "-" if value is None else format(value, pattern)


def _header(result: BenchResult) -> list[str]:
    settings, machine, shape = result.settings, result.machine, result.settings.shape
    device = machine.get("gpu", f"{machine['cpu']}, {machine['cpu_count']} cores")
    if settings.plain_process:
        process = "every model in this one process, interleaved round by round, as a user's script runs them"
        peer_tokens = "L tokens (the same document)"
        memory = ("MiB: peak above models and inputs, largest of the rounds" if settings.device.startswith("cuda")
                  else "memory: see the fresh-process run")
        times = f"times: median of {settings.repeats} rounds after a warm-up round; {memory}"
    else:
        process = "each measurement in a fresh process"
        peer_tokens = f"L + {shape.global_tokens} tokens"
        times = f"times: median of {settings.repeats} after a warm-up; MiB: peak above model and inputs"
    vector_code = [machine["vector_code"]] if machine.get("vector_code") else []
    return [
        "longdoc bench: GlobalLocalModel next to Longformer, BigBird and BERT (random init, batch 1)",
        f"process: {process}",
        f"machine: {device}; torch {machine['torch']}, transformers {machine['transformers']}",
        f"run: {settings.device} {settings.dtype}, {machine['threads']} threads, "
        f"allocator {machine['allocator']} (kernel THP mode: {machine['thp_system_mode']})",
        *vector_code,
        f"shape: {shape.num_layers} layers, hidden {shape.hidden_size}, {shape.num_heads} heads, "
        f"FFN {shape.intermediate_size}; ours: radius {shape.local_radius}, {shape.global_tokens} global tokens, "
        f"attention backend {settings.attention}" + (", compiled (torch.compile)" if settings.compile else ""),
        f"peers: {peer_tokens}; Longformer: first {shape.global_tokens} global, window "
        f"{settings.longformer_window}; BigBird: block {settings.bigbird_block_size}, "
        f"{settings.bigbird_random_blocks} random blocks; BERT: SDPA",
        f"matmul: {result.matmul.size}^3 {result.matmul.dtype} on {result.matmul.backend} (our linear layers' "
        f"GEMM), {result.matmul.gflops:.1f} GFLOP/s "
        f"(median of {len(result.matmul.seconds)})",
        f"{times}; x: time over {REFERENCE.name}'s at the same length",
    ]


COLUMNS = ("model", "L", "fwd s", "fwd+bwd s", "fwd MiB", "fwd+bwd MiB", "fwd x", "fwd+bwd x", "GFLOP/s", "of matmul")


def render_table(result: BenchResult) -> str:
    """The header, one line per (model, length), failures, then one PASS/FAIL/SKIP line per target."""
    cells = [COLUMNS] + [
        (
            row.model, str(row.length),
            _cell(row.forward_seconds, ".3f"), _cell(row.train_seconds, ".3f"),
            _cell(row.forward_peak_mib, ".0f"), _cell(row.train_peak_mib, ".0f"),
            _cell(row.forward_ratio, ".2f"), _cell(row.train_ratio, ".2f"),
            _cell(row.gflops, ".1f"), _cell(row.matmul_fraction, ".0%"),
        )
        for row in table_rows(result)
    ]
    widths = [max(len(line[column]) for line in cells) for column in range(len(COLUMNS))]
    lines = _header(result) + [""]
    for line in cells:
        # Model names read left-aligned, numbers right-aligned.
        lines.append("  ".join([line[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(line[1:], widths[1:])]))
    failures = [m for m in result.measurements if m.error]
    if failures:
        lines += [""] + [f"failed: {m.model} L={m.length} {m.mode}: {m.error}" for m in failures]
    return "\n".join(lines)


def to_json(result: BenchResult) -> dict:
    return {
        "settings": result.settings.to_dict(),
        "machine": result.machine,
        "matmul": result.matmul.to_dict(),
        "measurements": [measurement.to_dict() for measurement in result.measurements],
        "rows": [asdict(row) for row in table_rows(result)],
    }
