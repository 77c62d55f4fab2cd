"""The measuring process: one request in (JSON on stdin), one result out (JSON, last line of stdout).

`longdoc.bench.run` starts `python -m longdoc.bench.worker` afresh for every (model, length, mode)
and for the matmul baseline, so that each peak-memory reading sees only its own model. Rules: build
the model and inputs, one warm-up step, then `repeats` timed steps, reported by their median
(results.Measurement). A forward step runs under torch.inference_mode() in eval mode; a
forward+backward step runs in train mode (dropout is 0), backpropagates the sum of the outputs and
frees the gradients. Peak memory covers the warm-up and the timed steps, above the level once the
model and inputs exist (memory.PeakMemory).
"""

import json
import sys
import time
from collections.abc import Callable

import torch

from longdoc.bench.flops import encoder_forward_flops
from longdoc.bench.memory import PeakMemory
from longdoc.bench.models import build_runner
from longdoc.bench.results import MatmulMeasurement, Measurement
from longdoc.bench.settings import FORWARD, BenchSettings, Job
from longdoc.cpu_memory import configure_allocator
from longdoc.model import linear
from longdoc.model.backends.cpu import CpuBackend
from longdoc.model.backends.resolution import resolve_backend


def timed(step, device: torch.device) -> float:
    """Seconds of one call of `step` (on CUDA, after the device has finished)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def step_for(runner, mode: str):
    """The step that `mode` times: a forward under inference_mode in eval mode, or a
    forward+backward of the summed outputs in train mode (dropout is 0) that frees the gradients."""

    def forward() -> None:
        runner.model.eval()
        with torch.inference_mode():
            runner.model(**runner.inputs)

    def forward_backward() -> None:
        runner.model.train()
        runner.loss(runner.model(**runner.inputs)).backward()
        runner.model.zero_grad(set_to_none=True)

    return forward if mode == FORWARD else forward_backward


def forward_flops(job: Job, runner) -> int | None:
    """Our encoder's analytic forward FLOPs for the job (None for a peer). Under hard g2l the cpu
    backend skips the long keys a global token does not own, and they are not counted."""
    if not job.variant.is_ours:
        return None
    config, shape, parameter = runner.model.config, job.settings.shape, next(runner.model.parameters())
    skips = config.hard_g2l and resolve_backend(config.attention_backend, parameter.device, parameter.dtype) is CpuBackend
    long_keys = shape.tokens_per_global(job.length) if skips else None
    return encoder_forward_flops(config, job.length, shape.global_tokens, long_keys).total


def measure_job(job: Job) -> Measurement:
    """Time and peak memory of one Job in this process (see the module docstring for the rules)."""
    settings = job.settings
    runner = build_runner(job)
    device = torch.device(settings.device)
    step = step_for(runner, job.mode)
    with PeakMemory(settings.device) as memory:
        step()
        seconds = [timed(step, device) for _ in range(settings.repeats)]
    return Measurement(job.variant.name, job.length, job.mode, seconds, memory.peak_mib, forward_flops(job, runner))


def matmul_timer(settings: BenchSettings) -> Callable[[], float]:
    """A function that times one n x n by n x n product in the run's dtype and device (warmed up once),
    on the backend our linear layers use (longdoc.model.linear.product)."""
    device, n = torch.device(settings.device), settings.matmul_size
    generator = torch.Generator().manual_seed(settings.seed)
    left, right = (torch.randn(n, n, generator=generator).to(device, getattr(torch, settings.dtype)) for _ in range(2))
    linear.product(left, right)
    return lambda: timed(lambda: linear.product(left, right), device)


def measure_matmul(settings: BenchSettings) -> MatmulMeasurement:
    """Seconds of `settings.matmul_repeats` n x n by n x n matmuls in a row."""
    time_one = matmul_timer(settings)
    seconds = [time_one() for _ in range(settings.matmul_repeats)]
    return MatmulMeasurement(settings.matmul_size, settings.dtype, seconds, torch.get_num_threads(), linear.backend())


def main() -> int:
    """Request: {"job": Job.to_dict()} or {"matmul": BenchSettings.to_dict()}."""
    # The run's allocator (LONGDOC_ALLOCATOR in this process's environment), before any model is
    # built, ours or a peer's.
    configure_allocator()
    request = json.loads(sys.stdin.read())
    job = Job.from_dict(request["job"]) if "job" in request else None
    settings = job.settings if job else BenchSettings.from_dict(request["matmul"])
    if settings.threads:
        torch.set_num_threads(settings.threads)
    result = measure_job(job) if job else measure_matmul(settings)
    print(json.dumps(result.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
