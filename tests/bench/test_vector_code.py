"""The bench header's vector-code line (longdoc.bench.run.vector_code): which code torch, oneDNN and
MKL run, and, where torch is held to AVX2 on an AVX-512 CPU, the variables still needed to hold the
other two there (ATEN_CPU_CAPABILITY moves torch alone)."""

import pytest
import torch

from longdoc.bench import run
from longdoc.model import cpu_blas


@pytest.fixture
def machine(monkeypatch):
    """Sets (the CPU's best level, whether MKL keeps to AVX2 on it, torch's level)."""
    for name in (run.ONEDNN_ISA_VARIABLE, run.MKL_ISA_VARIABLE):
        monkeypatch.delenv(name, raising=False)

    def set_machine(best, mkl_keeps_to_avx2, torch_level):
        monkeypatch.setattr(cpu_blas, "cpu_best_level", lambda: best)
        monkeypatch.setattr(cpu_blas, "mkl_keeps_to_avx2", lambda: mkl_keeps_to_avx2)
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: torch_level)

    return set_machine


def test_an_intel_avx512_cpu_at_avx2_names_both_libraries_variables(machine):
    machine("avx512", False, "AVX2")
    assert run.vector_code() == ("vector code: torch avx2, oneDNN avx512, MKL avx512; to run them all at avx2 "
                                 "set ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2")


def test_an_amd_avx512_cpu_at_avx2_needs_onednns_alone(machine):
    machine("avx512", True, "AVX2")
    assert run.vector_code() == ("vector code: torch avx2, oneDNN avx512, MKL avx2 (not an Intel CPU); "
                                 "to run them all at avx2 set ONEDNN_MAX_CPU_ISA=AVX2")


def test_with_the_variables_set_the_line_names_them_and_asks_for_nothing(machine, monkeypatch):
    machine("avx512", False, "AVX2")
    monkeypatch.setenv(run.ONEDNN_ISA_VARIABLE, "AVX2")
    monkeypatch.setenv(run.MKL_ISA_VARIABLE, "AVX2")
    assert run.vector_code() == ("vector code: torch avx2, oneDNN at most AVX2 (ONEDNN_MAX_CPU_ISA), "
                                 "MKL at most AVX2 (MKL_ENABLE_INSTRUCTIONS)")


@pytest.mark.parametrize("best,mkl_keeps_to_avx2,torch_level,expected", [
    ("avx512", False, "AVX512", "vector code: torch avx512, oneDNN avx512, MKL avx512"),
    ("avx2", True, "AVX2", "vector code: torch avx2, oneDNN avx2, MKL avx2"),
])
def test_at_the_cpus_own_level_nothing_is_asked(machine, best, mkl_keeps_to_avx2, torch_level, expected):
    machine(best, mkl_keeps_to_avx2, torch_level)
    assert run.vector_code() == expected


def test_no_line_where_the_cpus_flags_cannot_be_read(machine):
    machine(None, False, "AVX2")
    assert run.vector_code() is None


def test_this_cpus_best_level_is_the_one_torch_dispatches_to():
    # (the flags' reading against torch's own detection, which ATEN_CPU_CAPABILITY would override)
    import os

    if os.environ.get(cpu_blas.CAPABILITY_VARIABLE):
        pytest.skip(f"{cpu_blas.CAPABILITY_VARIABLE} is set: torch's level is not its own choice")
    best = cpu_blas.cpu_best_level()
    if best is None:
        pytest.skip("no /proc/cpuinfo flags here (not x86 Linux)")
    assert best == torch.backends.cpu.get_cpu_capability().lower()
