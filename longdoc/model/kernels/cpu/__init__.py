"""The attention's compiled CPU kernels (C++, float32), built on first use and cached.

They run each softmax of the attention whole, projections to context, forward and backward, for
the `cpu` attention backend (longdoc.model.backends.cpu). The sources, one file per job:
- attention.h: what the forward and the backward share (the scheme, the operands records of the
  entry points, their shapes and checks);
- forward.cpp, backward.cpp: the plain and the talking-heads softmax, each way;
- products.h, products.cpp: their small products (q k^T, weights @ values) on BLAS's sgemm, or,
  on x86 CPUs not made by Intel, where MKL keeps to AVX2 (`wants_own_products()`), on the kernels'
  own AVX-512 or AVX2 code, whatever GEMM the linear layers run on (longdoc.model.linear);
- vectors.h: the vector operations of that code and of the softmax's rows, for either instruction set;
- binding.cpp: the Python module, whose entry points take their record's fields as keyword arguments.
They are compiled with torch's C++ extension tools (a C++ compiler and ninja; both are on most
Linux machines, and `pip install ninja` adds ninja) the first time a process needs them, into
$LONGDOC_CACHE/kernels (default ~/.cache/longdoc/kernels), one folder per sources' contents, flags
and torch version. They are built for the instruction set torch dispatches to (AVX-512, AVX2 or
neither), so ATEN_CPU_CAPABILITY=avx2 runs and measures the AVX2 build on an AVX-512 CPU; where the
variable asks for a level the CPU lacks (torch takes it at its word), they are not built. A built module is loaded from there as it is, without ninja, so every checkout
of the same sources (another folder, a reinstall) shares one build.

LONGDOC_KERNELS=0 keeps the `auto` backend from choosing them (and from building them): the attention
then runs its eager PyTorch path, which gives the same results (tests/model/backends holds them
together) more slowly on CPU. Where they cannot be built, one warning says why, `auto` runs the
eager path, and the `cpu` backend, asked for by name, is refused with the reason (`failure()`).
"""

import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import sys
import time
import warnings
from pathlib import Path

import torch

from longdoc.model import cpu_blas
from longdoc.model.cache import cache_dir

ENVIRONMENT_VARIABLE = "LONGDOC_KERNELS"
FOLDER = Path(__file__).parent
SOURCES = tuple(FOLDER / name for name in ("forward.cpp", "backward.cpp", "products.cpp", "binding.cpp"))
HEADERS = tuple(FOLDER / name for name in ("attention.h", "products.h", "vectors.h"))
_FAILURE_MARKS = ("error:", "not found", "No such file", "Permission denied")
# torch's build lock (a file in the build folder) is removed by the process that made it; one that
# was killed while building leaves it behind, and every later process would wait on it forever. A
# build takes minutes at most, so a lock this old has no builder left.
STALE_LOCK_SECONDS = 15 * 60


def enabled() -> bool:
    """Whether the `auto` backend may choose the kernels (LONGDOC_KERNELS is not 0)."""
    return os.environ.get(ENVIRONMENT_VARIABLE, "1") != "0"


def _compile_flags(capability: str | None = None) -> list[str]:
    """The flags of a build for `capability` (default: what torch itself dispatches to on this CPU)."""
    flags = ["-O3", "-fno-trapping-math", "-fopenmp"]  # no traps assumed: the exp loop vectorises
    capability = capability or torch.backends.cpu.get_cpu_capability()
    if capability == "AVX512":  # (faster than AVX2 on the softmaxes, forward and backward)
        flags += ["-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mfma", "-mprefer-vector-width=512"]
    elif capability == "AVX2":
        flags += ["-mavx2", "-mfma"]
    return flags


# Whether the CPU has an instruction set, by the name torch.backends.cpu.get_cpu_capability() gives it.
_CPU_HAS = {"AVX512": torch.cpu._is_avx512_supported, "AVX2": torch.cpu._is_avx2_supported}


def unsupported_capability() -> str | None:
    """Why the kernels are not built for the instruction set torch dispatches to: where
    ATEN_CPU_CAPABILITY asks for one this CPU lacks (their code would stop the process on its first
    instruction); None otherwise."""
    capability = torch.backends.cpu.get_cpu_capability()
    has = _CPU_HAS.get(capability)
    if has is None or has():
        return None
    return f"ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', '')} asks for {capability}, which this CPU lacks"


def clear_stale_lock(build_directory: Path) -> bool:
    """Remove the build lock in `build_directory` if no build can still hold it (older than
    STALE_LOCK_SECONDS), saying so; True if one was removed."""
    lock = build_directory / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return False
    if age < STALE_LOCK_SECONDS:
        return False  # a build in progress: cpp_extension waits for it
    warnings.warn(f"longdoc: removing {lock}, left {age / 60:.0f} minutes ago by a kernel build that did not "
                  "finish (a killed process)", stacklevel=3)
    lock.unlink(missing_ok=True)
    return True


def compiled():
    """The compiled module (`attention_forward`, `attention_backward`, the talking-heads variants),
    or None (after one warning) when it cannot be built."""
    return _build()[0]


def failure() -> str | None:
    """Why the kernels cannot be built here (the compiler's or the shell's own words), or None."""
    return _build()[1]


def is_built() -> bool:
    """Whether the kernels for these sources, flags and torch are in the cache, whole (no build holds
    their folder's lock): nothing is built to say so."""
    return _built_module_path() is not None


def _built_module_path() -> Path | None:
    directory, name = build_location()
    if (directory / "lock").exists():
        return None
    return next(iter(sorted(directory.glob(f"{name}*.so"))), None)


def load_built(path: Path, name: str):
    """The extension module at `path` (its init function is named after `name`)."""
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, path, loader=loader))
    loader.exec_module(module)
    return module


def build_location(capability: str | None = None) -> tuple[Path, str]:
    """The build folder and module name of these sources, compile flags (those for `capability`,
    default torch's) and torch version."""
    key = b"".join(path.read_bytes() for path in SOURCES + HEADERS) + " ".join(_compile_flags(capability)).encode()
    digest = hashlib.sha256(key + torch.__version__.encode()).hexdigest()[:12]
    return cache_dir() / "kernels" / f"attention-{digest}", f"longdoc_attention_{digest}"


@functools.cache
def _build():
    """(the compiled module, None), or (None, why) after one warning when it cannot be built."""
    build_directory, name = build_location()
    unsupported = unsupported_capability()
    if unsupported is not None:
        return _unbuilt(unsupported)
    built = _built_module_path()
    if built is None:
        print(f"longdoc: compiling the attention kernels into {build_directory} (once; about a minute)",
              file=sys.stderr, flush=True)
    try:
        if built is not None:
            module = load_built(built, name)
        else:
            from torch.utils import cpp_extension

            build_directory.mkdir(parents=True, exist_ok=True)
            clear_stale_lock(build_directory)
            module = cpp_extension.load(name=name, sources=[str(path) for path in SOURCES],
                                        extra_cflags=_compile_flags(), extra_ldflags=["-fopenmp"],
                                        build_directory=str(build_directory))
    except Exception as error:  # a missing compiler or ninja, a failed build: the eager path serves
        lines = str(error).strip().splitlines() or [type(error).__name__]
        # The compiler's or the shell's own words, not the command line ninja echoes first.
        reason = next((line for line in lines if any(mark in line for mark in _FAILURE_MARKS)), lines[-1])
        return _unbuilt(reason.strip())
    module.use_own_products(on=wants_own_products())
    return module, None


def wants_own_products() -> bool:
    """Whether the attention's small products run on the kernels' own code rather than BLAS's sgemm: on
    x86 CPUs not made by Intel, where MKL keeps to its AVX2 code and its sgemm is the slower on the
    softmaxes' small products (84 x 252 x 32), at AVX2 as at AVX-512, whichever GEMM the linear layers
    use (MKL or oneDNN). A no-op in a build with neither AVX-512 nor AVX2."""
    return cpu_blas.mkl_keeps_to_avx2()


def _unbuilt(reason: str) -> tuple[None, str]:
    """(None, reason) after the one warning that says why the eager path serves."""
    warnings.warn(f"longdoc: the attention kernels could not be built ({reason}); using the eager PyTorch path "
                  f"(slower on CPU; {ENVIRONMENT_VARIABLE}=0 skips the attempt)", stacklevel=4)
    return None, reason
