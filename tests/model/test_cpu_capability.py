"""ATEN_CPU_CAPABILITY set to a level the CPU lacks: the `longdoc` command warns once and runs at the
CPU's own level, where torch alone stops the process at its first vectorised operation."""

import os
import subprocess
import sys
import warnings

import pytest

from longdoc.model import cpu_blas

AVX2_CPU = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx fma avx2 f16c"
AVX512_CPU = AVX2_CPU + " avx512f avx512dq avx512bw avx512vl"


@pytest.mark.parametrize(("level", "flags", "dropped"), [
    ("avx512", AVX2_CPU, True),
    ("AVX512 ", AVX2_CPU, True),  # (torch reads it in any case, spaces around)
    ("avx2", "fpu sse sse2 avx", True),
    ("avx512", AVX512_CPU, False),
    ("avx2", AVX2_CPU, False),
    ("default", "fpu", False),
    ("avx512", None, False),  # flags that cannot be read: left as the user set it
])
def test_a_level_the_cpu_lacks_is_dropped_with_one_warning(monkeypatch, level, flags, dropped):
    monkeypatch.setattr(cpu_blas, "_cpuinfo_field", lambda name: flags if name == "flags" else None)
    monkeypatch.setenv(cpu_blas.CAPABILITY_VARIABLE, level)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cpu_blas.configure_capability()
    assert (cpu_blas.CAPABILITY_VARIABLE not in os.environ) == dropped
    assert [str(w.message) for w in caught] == ([
        f"ATEN_CPU_CAPABILITY={level.strip().lower()} asks for {level.strip().upper()} instructions, which this "
        "CPU lacks; ignoring it (torch runs the CPU's own best level)"] if dropped else [])


def test_without_the_variable_nothing_changes(monkeypatch):
    monkeypatch.delenv(cpu_blas.CAPABILITY_VARIABLE, raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cpu_blas.configure_capability()
    assert cpu_blas.CAPABILITY_VARIABLE not in os.environ


def test_ask_runs_where_the_variable_asks_for_instructions_the_cpu_lacks(tmp_path):
    if not cpu_blas.cpu_lacks("avx512"):
        pytest.skip("this CPU has AVX-512, the highest level torch dispatches to on x86: no level it lacks")
    document = tmp_path / "olt.txt"
    document.write_text("The river Olt flows through Braniburg. Braniburg is a town in the hills.\n")
    env = dict(os.environ, ATEN_CPU_CAPABILITY="avx512", LONGDOC_CACHE=str(tmp_path / "cache"))
    run = subprocess.run([sys.executable, "-m", "longdoc.cli", "ask", "--question", "Which river flows through "
                          "Braniburg?", str(document)], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]  # (132 and "Illegal instruction" without the fix)
    assert run.stdout.startswith("The river Olt flows through Braniburg.")
    assert run.stderr.count("ATEN_CPU_CAPABILITY=avx512 asks for AVX512 instructions, which this CPU lacks") == 1
