"""One benchmark run: the matmul baseline, then every job, each in a fresh measuring process.

Every measuring process, ours and the peers' alike, starts with the allocator of the run's settings
(longdoc.cpu_memory: jemalloc keeping freed pages where found, else transparent huge pages), since
on CPU a fresh 100 MB tensor can cost several times its compute in page faults.
"""

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from longdoc.bench.results import BenchResult, MatmulMeasurement, Measurement
from longdoc.bench.settings import BenchSettings
from longdoc.cpu_memory import allocator_environment

THP_SYSTEM_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


class MeasurementFailed(RuntimeError):
    """A measuring process exited with an error; the message is its last line of stderr."""


def run_in_fresh_process(request: dict, settings: BenchSettings) -> dict:
    """Run one worker request in a new Python process and return its JSON reply."""
    env = {
        **os.environ,
        **allocator_environment(settings.allocator),
        "TRANSFORMERS_VERBOSITY": "error",  # Longformer warns on every call that it pads its input
    }
    completed = subprocess.run(
        [sys.executable, "-m", "longdoc.bench.worker"],
        input=json.dumps(request), capture_output=True, text=True, env=env,
    )
    lines = completed.stdout.strip().splitlines()
    if completed.returncode != 0 or not lines:
        errors = completed.stderr.strip().splitlines() or [f"exit status {completed.returncode}"]
        raise MeasurementFailed(errors[-1])
    return json.loads(lines[-1])


def _cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _thp_system_mode() -> str:
    """The kernel's THP mode, the bracketed word in e.g. "always [madvise] never"."""
    if not THP_SYSTEM_SETTING.exists():
        return "unavailable"
    text = THP_SYSTEM_SETTING.read_text()
    return text[text.find("[") + 1 : text.find("]")] if "[" in text else text.strip()


def machine_info(settings: BenchSettings, threads: int) -> dict:
    """Where the run happened; `threads` is what the measuring processes used (the matmul reports it)."""
    import torch

    info = {
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "threads": threads,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": importlib.metadata.version("transformers"),
        "thp_system_mode": _thp_system_mode(),
        "allocator": settings.allocator,
    }
    if settings.device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(torch.device(settings.device))
    return info


def run_benchmark(settings: BenchSettings, progress: Callable[[Measurement], None] | None = None) -> BenchResult:
    """Measure the matmul baseline, then every job of `settings`; `progress` hears of each measurement."""
    matmul = MatmulMeasurement.from_dict(run_in_fresh_process({"matmul": settings.to_dict()}, settings))
    measurements = []
    for job in settings.jobs():
        # One failure (a peer out of memory, say) is reported in its row; the run goes on.
        try:
            measurement = Measurement.from_dict(run_in_fresh_process({"job": job.to_dict()}, settings))
        except MeasurementFailed as failure:
            measurement = Measurement(job.variant.name, job.length, job.mode, error=str(failure))
        measurements.append(measurement)
        if progress:
            progress(measurement)
    return BenchResult(settings, machine_info(settings, matmul.threads), matmul, measurements)
