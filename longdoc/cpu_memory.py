"""Allocator settings for long inputs on CPU.

At 4k tokens every attention layer works on tensors of 40-100 MB. glibc returns such blocks to the
kernel when they are freed, so each new one is mapped and faulted in afresh: measured here, that
makes an add or a softmax 3-4x slower than on reused memory, and a forward+backward spends a third
of its time in the kernel. The inference path of the encoder reuses its buffers itself
(longdoc.model.attention.Workspace); training cannot (autograd keeps what it needs), so the process's
allocator matters:

- "jemalloc": preload jemalloc with freed pages kept mapped (dirty and muzzy decay off). No page
  faults after the first step. Needs the library (Debian/Ubuntu: `apt-get install libjemalloc2`).
- "thp": torch asks for transparent huge pages for its large blocks (THP_MEM_ALLOC_ENABLE=1):
  512x fewer faults, but each 2 MB page is still zeroed (and compacted) afresh.
- "system": the defaults.

Both settings must be in the environment before the process starts (LD_PRELOAD) or before torch
makes its first large allocation (THP_MEM_ALLOC_ENABLE).
"""

import ctypes.util
import os
from pathlib import Path

ALLOCATORS = ("auto", "jemalloc", "thp", "system")
JEMALLOC_CONF = "dirty_decay_ms:-1,muzzy_decay_ms:-1"
_JEMALLOC_PLACES = (
    "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
    "/usr/lib64/libjemalloc.so.2",
    "/usr/local/lib/libjemalloc.so.2",
    "/usr/local/lib/libjemalloc.so",
)


def find_jemalloc() -> str | None:
    """The path of a jemalloc shared library on this machine, or None."""
    for place in _JEMALLOC_PLACES:
        if Path(place).is_file():
            return place
    name = ctypes.util.find_library("jemalloc")
    return name if name and Path(name).is_absolute() else None


def resolve_allocator(allocator: str) -> str:
    """"auto" -> "jemalloc" where the library is found, else "thp"."""
    if allocator not in ALLOCATORS:
        raise ValueError(f"allocator must be one of {ALLOCATORS}, got {allocator!r}")
    if allocator == "auto":
        return "jemalloc" if find_jemalloc() else "thp"
    return allocator


def allocator_environment(allocator: str) -> dict[str, str]:
    """Environment variables that select `allocator` ("jemalloc", "thp" or "system") for a new process."""
    if allocator == "jemalloc":
        library = find_jemalloc()
        if library is None:
            raise ValueError("allocator 'jemalloc': no libjemalloc found (Debian/Ubuntu: apt-get install libjemalloc2)")
        preload = " ".join(filter(None, [library, os.environ.get("LD_PRELOAD", "")]))
        return {"LD_PRELOAD": preload, "MALLOC_CONF": JEMALLOC_CONF, "THP_MEM_ALLOC_ENABLE": "0"}
    if allocator == "thp":
        return {"THP_MEM_ALLOC_ENABLE": "1"}
    if allocator == "system":
        return {"THP_MEM_ALLOC_ENABLE": "0"}
    raise ValueError(f"allocator must be 'jemalloc', 'thp' or 'system', got {allocator!r}")
