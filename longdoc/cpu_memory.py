"""How freed memory is kept on CPU: set by the entry points, never by importing the library.

At 4k tokens every attention layer works on tensors of 40-100 MB. glibc's malloc serves blocks
above its mmap threshold (128 KiB, adapting up to 32 MiB) with a fresh mmap and unmaps them when they
are freed, and trims its heap when the top is free, so every such tensor is faulted in afresh, page
by page, and an add or a softmax on fresh memory runs several times slower than on reused memory.
Inference reuses its own buffers (longdoc.model.backends.eager.Workspace), but training cannot (autograd
keeps what it needs), and runs far slower on glibc's defaults than with freed memory kept.

So the entry points call `configure_allocator()` before any model is built: the `longdoc` command
(longdoc.cli.main, which `torchrun scripts/...` runs too), the scripts in scripts/ that run the model
in their own process, and the benchmark's measuring processes. On glibc it asks malloc to keep what
it frees: large blocks come from the heap instead of separate mmaps (M_MMAP_MAX = 0) and the heap is
never trimmed (M_TRIM_THRESHOLD = -1, see mallopt(3)). The process then keeps its peak memory mapped
until it exits, as jemalloc with decay off does. Importing longdoc changes nothing: a user's own
script that trains the model calls `configure_allocator()` itself for the same setting.

Opt out with the environment variable LONGDOC_ALLOCATOR=system (glibc's defaults are left alone).
An allocator that is preloaded (LD_PRELOAD of jemalloc or tcmalloc) is left alone too. Where the
setting cannot be applied (not glibc), one warning says so and the system's defaults stay.

The commands that embed text of every length (`ask`, `index`, `serve`) also call
`uncache_onednn_primitives()`: see there.

For the benchmark's fresh processes, `allocator_environment` names the variables that select an
allocator before a process starts: "jemalloc" (preloaded, freed pages kept), "keep" (the library's
own setting above), "thp" (torch's transparent huge pages for large blocks, glibc otherwise at its
defaults) and "system".
"""

import ctypes
import ctypes.util
import os
import warnings
from pathlib import Path

ENVIRONMENT_VARIABLE = "LONGDOC_ALLOCATOR"
KEEP, SYSTEM = "keep", "system"

# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4

ALLOCATORS = ("auto", "jemalloc", KEEP, "thp", SYSTEM)
JEMALLOC_CONF = "dirty_decay_ms:-1,muzzy_decay_ms:-1"
_JEMALLOC_PLACES = (
    "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
    "/usr/lib64/libjemalloc.so.2",
    "/usr/local/lib/libjemalloc.so.2",
    "/usr/local/lib/libjemalloc.so",
)

_applied: str | None = None


def _glibc() -> ctypes.CDLL | None:
    """glibc, when it is this process's C library and its malloc is the one in use; else None."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # glibc only (not musl, not macOS)
        libc.mallopt
    except (OSError, AttributeError):
        return None
    return libc


def _malloc_is_interposed(libc: ctypes.CDLL) -> bool:
    """True when another allocator (a preloaded jemalloc, say) serves this process's malloc."""
    in_use = ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value
    return in_use != ctypes.cast(libc.malloc, ctypes.c_void_p).value


def configure_allocator() -> str:
    """Apply LONGDOC_ALLOCATOR (default "keep") once per process; return what is in effect:
    "keep", "system", or "preloaded" (another allocator serves malloc and is left alone)."""
    global _applied
    if _applied is not None:
        return _applied
    wanted = os.environ.get(ENVIRONMENT_VARIABLE, KEEP).strip().lower() or KEEP
    if wanted not in (KEEP, SYSTEM):
        warnings.warn(
            f"{ENVIRONMENT_VARIABLE}={wanted!r} is not one of {KEEP!r}, {SYSTEM!r}; using {KEEP!r}",
            RuntimeWarning, stacklevel=2,
        )
        wanted = KEEP
    _applied = wanted
    if wanted == SYSTEM:
        return _applied
    libc = _glibc()
    if libc is None:
        warnings.warn(
            f"{ENVIRONMENT_VARIABLE}={KEEP!r} needs glibc's mallopt, which this system lacks; using the "
            f"system allocator's defaults (set {ENVIRONMENT_VARIABLE}=system to silence this)",
            RuntimeWarning, stacklevel=2,
        )
        _applied = SYSTEM
    elif _malloc_is_interposed(libc):
        _applied = "preloaded"
    elif not (libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, -1)):
        warnings.warn(
            f"{ENVIRONMENT_VARIABLE}={KEEP!r}: glibc refused mallopt; using the system allocator's defaults",
            RuntimeWarning, stacklevel=2,
        )
        _applied = SYSTEM
    return _applied


ONEDNN_CACHE_VARIABLE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"


def uncache_onednn_primitives() -> None:
    """oneDNN's primitive cache off (ONEDNN_PRIMITIVE_CACHE_CAPACITY=0) unless the variable is set;
    for processes whose tensors change shape from call to call. Call it before the first GELU.

    torch runs a float32 GELU through oneDNN, which compiles a kernel for each tensor shape and caches
    up to 1,024 of them, some 2.9 MiB each (torch 2.13, AMD EPYC Zen 3: GELU over (64, i, 1536) for
    i = 1..200 grew the process by 574 MiB, by 6 with the cache off). Batches of texts have a new
    shape almost every time, so `longdoc index` grew by about 0.38 MiB a file, toward 3 GiB,
    and `serve` would with every question. Compiled afresh each call, a GELU costs some 0.09 ms
    more (0.021 -> 0.107 ms for one short text; a training step at 512 wordpieces makes 24 GELU
    calls), which the commands that keep their shapes need not pay: on CPUs with bfloat16
    instructions oneDNN also runs bfloat16 products, whose kernels take longer to compile."""
    os.environ.setdefault(ONEDNN_CACHE_VARIABLE, "0")


def find_jemalloc() -> str | None:
    """The path of a jemalloc shared library on this machine, or None."""
    for place in _JEMALLOC_PLACES:
        if Path(place).is_file():
            return place
    name = ctypes.util.find_library("jemalloc")
    return name if name and Path(name).is_absolute() else None


def resolve_allocator(allocator: str) -> str:
    """"auto" -> "jemalloc" where the library is found, else the library's own "keep"."""
    if allocator not in ALLOCATORS:
        raise ValueError(f"allocator must be one of {ALLOCATORS}, got {allocator!r}")
    if allocator == "auto":
        return "jemalloc" if find_jemalloc() else KEEP
    return allocator


def allocator_environment(allocator: str) -> dict[str, str]:
    """Environment variables that select `allocator` ("jemalloc", "keep", "thp" or "system") for a new process."""
    if allocator == "jemalloc":
        library = find_jemalloc()
        if library is None:
            raise ValueError("allocator 'jemalloc': no libjemalloc found (Debian/Ubuntu: apt-get install libjemalloc2)")
        preload = " ".join(filter(None, [library, os.environ.get("LD_PRELOAD", "")]))
        return {"LD_PRELOAD": preload, "MALLOC_CONF": JEMALLOC_CONF, "THP_MEM_ALLOC_ENABLE": "0"}
    if allocator == KEEP:
        return {ENVIRONMENT_VARIABLE: KEEP, "THP_MEM_ALLOC_ENABLE": "0"}
    if allocator == "thp":
        return {ENVIRONMENT_VARIABLE: SYSTEM, "THP_MEM_ALLOC_ENABLE": "1"}
    if allocator == SYSTEM:
        return {ENVIRONMENT_VARIABLE: SYSTEM, "THP_MEM_ALLOC_ENABLE": "0"}
    raise ValueError(f"allocator must be 'jemalloc', 'keep', 'thp' or 'system', got {allocator!r}")
