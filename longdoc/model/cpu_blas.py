"""MKL's products made reproducible, and torch held to instructions the CPU has: set by the entry
points, never by importing the library.

torch's BLAS on x86 is MKL, whose sgemm gives results that depend on where its operands lie in
memory: F.linear of a 64 x 384 input on a 2 x 384 weight, the operands copied to 15 other float
offsets, ends in other last bits at 12 of them (AMD EPYC Zen 3). A training run killed and resumed
from a checkpoint then ends on other weights than the run that was never stopped. MKL's conditional
numerical reproducibility removes that: with MKL_CBWR=AVX2 the same products give the same bits at
every offset (146 shapes, 1 and 2 threads), at the speed they had. MKL reads the variable at its first
product (not when torch is imported), so it has to be in the environment before then, and a library
import may not change the process's environment.

So the `longdoc` command (longdoc.cli.main) calls `configure_blas()` before any command runs: on x86
CPUs not made by Intel where torch will not run AVX-512 code, it sets MKL_CBWR=AVX2 unless the
variable is set already. MKL keeps to its AVX2 code on such CPUs whatever they have, so the setting
costs nothing there, and longdoc.model.linear, seeing it, runs the linear layers on MKL, the faster
GEMM at AVX2 (elsewhere oneDNN, reproducible without it). The processes the command starts (the
benchmark's, torchrun's) inherit it. Importing longdoc changes nothing: a user's own script calls
`configure_blas()` first, or sets MKL_CBWR itself, for the same choice.

The command also calls `configure_capability()`: torch takes ATEN_CPU_CAPABILITY at its word, and
set to a level the CPU lacks (avx512 on an AVX2 CPU) its first vectorised operation stops the
process ("Illegal instruction", exit 132). The command warns and drops the variable instead.

This module imports neither torch nor anything that does (`longdoc --help` stays fast).
"""

import os
import platform
import warnings
from pathlib import Path

ENVIRONMENT_VARIABLE = "MKL_CBWR"
SETTING = "AVX2"
# The values under which MKL's products give the same bits wherever the operands lie, at the speed
# of its AVX2 code (checked at 16 offsets; AUTO is MKL's own pick, AVX2 on CPUs not made by Intel).
# COMPATIBLE is reproducible too, at a third of the speed: oneDNN is then the faster.
REPRODUCIBLE = ("AVX2", "AVX2,STRICT", "AUTO", "AUTO,STRICT")
_AVX512 = ("avx512f", "avx512bw", "avx512dq", "avx512vl")  # what torch's AVX-512 code needs


def _cpuinfo_lines() -> list[str]:
    cpuinfo = Path("/proc/cpuinfo")
    return cpuinfo.read_text(errors="replace").splitlines() if cpuinfo.exists() else []


def _cpuinfo_field(name: str) -> str | None:
    """The first processor's `name` field in /proc/cpuinfo, or None where there is none."""
    for line in _cpuinfo_lines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return None


def cpu_vendor() -> str:
    """The x86 vendor string (GenuineIntel, AuthenticAMD, ...), or "" where it cannot be read."""
    if Path("/proc/cpuinfo").exists():
        return _cpuinfo_field("vendor_id") or ""
    return platform.processor()  # Windows names the vendor here ("... AuthenticAMD")


def mkl_keeps_to_avx2() -> bool:
    """Whether this is an x86 CPU not made by Intel: where MKL runs its AVX2 code whatever the CPU has."""
    vendor = cpu_vendor()
    return platform.machine().lower() in ("x86_64", "amd64") and bool(vendor) and "GenuineIntel" not in vendor


def _torch_below_avx512() -> bool:
    """Whether torch will run below AVX-512 here, told without importing it: the CPU lacks AVX-512 (its
    /proc/cpuinfo flags), or ATEN_CPU_CAPABILITY holds torch below it. False where the flags cannot
    be read."""
    if os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower() in ("default", "avx2"):
        return True
    flags = _cpuinfo_field("flags")
    return flags is not None and not set(_AVX512) <= set(flags.split())


def mkl_reproducible() -> bool:
    """Whether MKL_CBWR asks MKL for products that do not depend on where the operands lie, at its AVX2
    speed (one of REPRODUCIBLE; MKL reads it case-insensitively, spaces ignored)."""
    value = "".join(os.environ.get(ENVIRONMENT_VARIABLE, "").split()).upper()
    return value in REPRODUCIBLE


def configure_blas() -> None:
    """MKL_CBWR=AVX2 on x86 CPUs not made by Intel where torch runs below AVX-512, unless the variable
    is set (see the module's docstring). Call it before the process's first product."""
    if mkl_keeps_to_avx2() and _torch_below_avx512():
        os.environ.setdefault(ENVIRONMENT_VARIABLE, SETTING)


CAPABILITY_VARIABLE = "ATEN_CPU_CAPABILITY"
# The /proc/cpuinfo flags each x86 level of torch's dispatch runs on (its AVX2 code uses FMA too).
_LEVEL_NEEDS = {"avx512": _AVX512 + ("fma",), "avx2": ("avx2", "fma")}


def cpu_lacks(level: str) -> bool:
    """Whether this CPU lacks the instructions torch's dispatch level `level` ("avx512", "avx2", as
    ATEN_CPU_CAPABILITY names them) runs; False for other levels and where the flags cannot be read."""
    needs = _LEVEL_NEEDS.get(level)
    flags = _cpuinfo_field("flags")
    return needs is not None and flags is not None and not set(needs) <= set(flags.split())


def cpu_best_level() -> str | None:
    """The highest of torch's x86 dispatch levels this CPU runs ("avx512", "avx2", else "default"),
    None where /proc/cpuinfo's flags cannot be read (not Linux, not x86)."""
    flags = _cpuinfo_field("flags")
    if flags is None or platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    return next((level for level, needs in _LEVEL_NEEDS.items() if set(needs) <= set(flags.split())), "default")


def unsupported_capability() -> str | None:
    """The level ATEN_CPU_CAPABILITY asks for where this CPU lacks it (torch takes the variable at its
    word, and its code for that level stops the process at its first instruction: "Illegal
    instruction"), else None."""
    level = os.environ.get(CAPABILITY_VARIABLE, "").strip().lower()
    return level if cpu_lacks(level) else None


def configure_capability() -> None:
    """Where ATEN_CPU_CAPABILITY asks for a level this CPU lacks, one warning, and the variable
    removed, so that torch dispatches to the best level the CPU has. Call it before the process's
    first torch operation (torch reads the variable then); the processes it starts inherit the fix."""
    level = unsupported_capability()
    if level is not None:
        del os.environ[CAPABILITY_VARIABLE]
        warnings.warn(f"{CAPABILITY_VARIABLE}={level} asks for {level.upper()} instructions, which this CPU "
                      "lacks; ignoring it (torch runs the CPU's own best level)", RuntimeWarning, stacklevel=2)
