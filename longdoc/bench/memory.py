"""Peak memory of a block of work, above what was in use just before it.

CPU (Linux): the kernel's resident high-water mark (VmHWM in /proc/self/status, the counter behind
getrusage's ru_maxrss) is reset by writing "5" to /proc/self/clear_refs; the peak is the mark after
the work minus the resident size (VmRSS) before it. ru_maxrss itself is not used: in a process
started by subprocess it also holds the parent's high-water mark from before exec, and it cannot be
reset. Elsewhere the peak is not measured (None). The benchmark's processes keep freed memory in the
heap (longdoc/cpu_memory.py): memory freed before the block and reused inside it is not counted, which is
why the benchmark measures each model in a fresh process.
CUDA: torch.cuda.max_memory_allocated after reset_peak_memory_stats, minus memory_allocated before.
"""

import gc
from pathlib import Path

import torch

MIB = 2**20
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_RESET_HIGH_WATER_MARK = "5"


def _status_kib(key: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(f"{key} not in {_STATUS}")


class PeakMemory:
    """Context manager: `peak_mib` is the peak memory inside the block above the level before it."""

    def __init__(self, device: str):
        self.device = torch.device(device)
        self.peak_mib: float | None = None
        self._before_bytes = 0

    def __enter__(self) -> "PeakMemory":
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._before_bytes = torch.cuda.memory_allocated(self.device)
        elif _CLEAR_REFS.exists():
            _CLEAR_REFS.write_text(_RESET_HIGH_WATER_MARK)
            self._before_bytes = _status_kib("VmRSS") * 1024
        return self

    def __exit__(self, *exc_info) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_mib = (torch.cuda.max_memory_allocated(self.device) - self._before_bytes) / MIB
        elif _CLEAR_REFS.exists():
            self.peak_mib = (_status_kib("VmHWM") * 1024 - self._before_bytes) / MIB
