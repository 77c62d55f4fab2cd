"""The plain-process benchmark: every model in this one process, interleaved, as a user's
script runs them, and the batched-inference table.

A user's script imports longdoc, builds the models and calls them; nothing is preloaded, and memory
is handled as the `longdoc` command sets it (longdoc.cpu_memory). Here every model is built once per
length, then each round times every model's forward and then its forward+backward in turn, so that
load on the machine falls on all of them alike; the first round is a warm-up. Each peer reads the
same L-token document our encoder reads as L long tokens plus G global ones. The matmul baseline is
sampled the same way, once before every timed step, so that the share of its rate our forward
reaches compares two speeds of the same minutes (five matmuls in a row at the start measured 338,
350 and 380 GFLOP/s in three runs of the same code within an hour, while our forward ran at 212-217
in all three). Peak memory is measured on CUDA only, where the allocator's counters give each step's
own peak in one process; on the CPU, memory freed by one model stays mapped for the next, and the
fresh-process run (longdoc.bench.run) measures it.
"""

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from longdoc.bench.memory import PeakMemory
from longdoc.bench.models import build_runner
from longdoc.bench.results import BenchResult, MatmulMeasurement, Measurement
from longdoc.bench.run import machine_info
from longdoc.bench.settings import FORWARD, MODES, REFERENCE, BenchSettings, Job
from longdoc.bench.worker import forward_flops, matmul_timer, step_for, timed
from longdoc.cpu_memory import configure_allocator
from longdoc.model import linear

BATCH_SIZES = (1, 4, 16)
BATCH_LENGTHS = (512, 2048, 4096)
# Batched windows carry one global token per 16 long tokens (256 at 4096, ETC's sentence globals).
LONG_TOKENS_PER_GLOBAL = 16


def run_plain(settings: BenchSettings, progress: Callable[[Measurement], None] | None = None) -> BenchResult:
    """Every (variant, length, mode) of `settings` and the matmul baseline, interleaved in this process."""
    allocator = configure_allocator()  # what the `longdoc` command does; the matmul runs under it too
    if settings.threads:
        torch.set_num_threads(settings.threads)
    time_matmul, matmul_seconds = matmul_timer(settings), []
    device = torch.device(settings.device)
    measurements = []
    for length in settings.lengths:
        variants = [v for v in settings.variants if v.is_ours or length <= settings.peer_max_length]
        jobs = {(v.name, mode): Job(settings, v, length, mode) for v in variants for mode in MODES}
        runners = {v.name: build_runner(jobs[v.name, FORWARD]) for v in variants}
        seconds = {key: [] for key in jobs}
        peaks: dict = {}  # on CUDA only: its allocator's counters give each step's own peak in one process
        errors = {}
        for round_number in range(settings.repeats + 1):
            for key in jobs:
                if key in errors:
                    continue
                if round_number:  # round 0 is the warm-up
                    matmul_seconds.append(time_matmul())
                # One failure (a peer out of memory, say) is reported in its row; the run goes on.
                try:
                    with PeakMemory(settings.device) if device.type == "cuda" else contextlib.nullcontext() as memory:
                        took = timed(step_for(runners[key[0]], key[1]), device)
                except RuntimeError as error:  # (torch.OutOfMemoryError is one)
                    errors[key] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                    continue
                if memory is not None:
                    peaks[key] = max(peaks.get(key, 0.0), memory.peak_mib)
                if round_number:
                    seconds[key].append(took)
        for key, job in jobs.items():
            if key in errors:
                measurement = Measurement(key[0], length, key[1], error=errors[key])
            else:
                measurement = Measurement(key[0], length, key[1], seconds[key], peaks.get(key),
                                          forward_flops(job, runners[key[0]]))
            measurements.append(measurement)
            if progress:
                progress(measurement)
        del runners
    matmul = MatmulMeasurement(settings.matmul_size, settings.dtype, matmul_seconds or [time_matmul()],
                               torch.get_num_threads(), linear.backend())
    machine = machine_info(settings, matmul.threads)
    machine["allocator"] = f"in-process ({allocator})"
    return BenchResult(settings, machine, matmul, measurements)


@dataclass(frozen=True)
class BatchedRow:
    """Our encoder's forward on `batch_size` windows of `length` long tokens (and length / 16 globals)."""

    length: int
    batch_size: int
    seconds: list

    @property
    def examples_per_second(self) -> float:
        return self.batch_size / sorted(self.seconds)[len(self.seconds) // 2]


def run_batched(
    settings: BenchSettings,
    batch_sizes: tuple = BATCH_SIZES,
    lengths: tuple = BATCH_LENGTHS,
    progress: Callable[[BatchedRow], None] | None = None,
) -> list[BatchedRow]:
    """Examples per second of the reference variant's forward, for windows batched by length: every
    batch holds windows of one length, as predict and ask group them."""
    configure_allocator()
    if settings.threads:
        torch.set_num_threads(settings.threads)
    device = torch.device(settings.device)
    rows = []
    for length in lengths:
        shape = replace(settings.shape, global_tokens=max(1, length // LONG_TOKENS_PER_GLOBAL))
        runner = build_runner(Job(replace(settings, shape=shape), REFERENCE, length, FORWARD))
        single = runner.inputs
        for batch_size in batch_sizes:
            runner.inputs = {name: tensor.expand(batch_size, *tensor.shape[1:]).contiguous() for name, tensor in single.items()}
            step = step_for(runner, FORWARD)
            step()
            row = BatchedRow(length, batch_size, [timed(step, device) for _ in range(settings.repeats)])
            rows.append(row)
            if progress:
                progress(row)
    return rows


def render_batched(rows: list[BatchedRow], settings: BenchSettings) -> str:
    """Examples per second, one line per length, one column per batch size."""
    sizes = sorted({row.batch_size for row in rows})
    lengths = sorted({row.length for row in rows})
    rate = {(row.length, row.batch_size): row.examples_per_second for row in rows}
    lines = [
        f"batched inference: {REFERENCE.name} forward, examples/s (median of {settings.repeats}), "
        f"windows of one length per batch, one global token per {LONG_TOKENS_PER_GLOBAL} long tokens",
        "  ".join(["L".rjust(6)] + [f"batch {size}".rjust(9) for size in sizes]),
    ]
    for length in lengths:
        cells = [f"{rate[length, size]:.2f}" if (length, size) in rate else "-" for size in sizes]
        lines.append("  ".join([str(length).rjust(6)] + [cell.rjust(9) for cell in cells]))
    return "\n".join(lines)
