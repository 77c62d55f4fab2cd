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


ONEDNN_ISA_VARIABLE, MKL_ISA_VARIABLE = "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"


def vector_code() -> str | None:
    """The vector code torch, oneDNN and MKL run here, for the table's header; None off x86 Linux.

    ATEN_CPU_CAPABILITY moves torch (and our attention kernels) alone. oneDNN (our linear layers'
    GEMM where `auto` picks it) runs the CPU's best code unless ONEDNN_MAX_CPU_ISA holds it lower, and
    MKL (the peers' linear layers, ours on an Intel CPU) likewise on an Intel CPU unless
    MKL_ENABLE_INSTRUCTIONS does (on other CPUs it keeps to AVX2): measuring AVX2 on an AVX-512 CPU
    takes the three together, and the line says which are missing."""
    import torch

    from longdoc.model import cpu_blas

    best = cpu_blas.cpu_best_level()
    if best is None:
        return None
    torch_level = torch.backends.cpu.get_cpu_capability().lower()
    onednn = os.environ.get(ONEDNN_ISA_VARIABLE)
    mkl = os.environ.get(MKL_ISA_VARIABLE)
    keeps_to_avx2 = cpu_blas.mkl_keeps_to_avx2()
    mkl_below = mkl or keeps_to_avx2
    mkl_level = (f"at most {mkl} ({MKL_ISA_VARIABLE})" if mkl else
                 "avx2 (not an Intel CPU)" if best == "avx512" and keeps_to_avx2 else best)
    text = (f"vector code: torch {torch_level}, oneDNN "
            f"{f'at most {onednn} ({ONEDNN_ISA_VARIABLE})' if onednn else best}, MKL {mkl_level}")
    missing = [name for name, held in ((ONEDNN_ISA_VARIABLE, onednn), (MKL_ISA_VARIABLE, mkl_below)) if not held]
    if torch_level == "avx2" and best == "avx512" and missing:
        text += f"; to run them all at avx2 set {' '.join(f'{name}=AVX2' for name in missing)}"
    return text


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
        "vector_code": vector_code(),
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
