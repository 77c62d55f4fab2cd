"""The allocator setting the library applies when the model is imported (longdoc.cpu_memory), and the
settings handed to the benchmark's fresh processes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from longdoc import cpu_memory
from longdoc.cpu_memory import allocator_environment, configure_allocator, find_jemalloc, resolve_allocator

# In a fresh process: import the model, fill a 256 MiB tensor twice (the heap grows to hold it),
# then print the fewest page faults of four more fills. Memory kept by malloc is already mapped;
# memory given back to the kernel is faulted in again, page by page. (The fewest, because the
# heap may need to grow twice: a small block allocated after the first tensor keeps its freed
# 256 MiB from the top, and torch's 64-byte-aligned request needs a little more than that.)
REFAULTS = """
import resource, torch, longdoc.model.attention
from longdoc.cpu_memory import configure_allocator
def faults_of_a_fill():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(64 * 2**20)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults_of_a_fill()
faults_of_a_fill()
print(configure_allocator(), min(faults_of_a_fill() for _ in range(4)))
"""
PAGES = 256 * 2**20 // 4096


def fewest_refaults(**environment) -> tuple[str, int]:
    env = {**os.environ, "THP_MEM_ALLOC_ENABLE": "0", **environment}
    env.pop("LD_PRELOAD", None)
    applied, faults = subprocess.run(
        [sys.executable, "-c", REFAULTS], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    return applied, int(faults)


def test_importing_the_model_keeps_freed_memory_and_system_opts_out():
    applied, faults = fewest_refaults()
    assert applied == "keep" and faults < PAGES // 20
    thp_always = "[always]" in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    applied, faults = fewest_refaults(LONGDOC_ALLOCATOR="system")
    assert applied == "system"
    if not thp_always:  # with 2 MiB pages everywhere the kernel itself faults 512x less
        assert faults > PAGES // 2


def test_a_setting_that_cannot_be_applied_warns_once_and_uses_the_defaults(monkeypatch):
    monkeypatch.setattr(cpu_memory, "_applied", None)
    monkeypatch.setattr(cpu_memory, "_glibc", lambda: None)  # as on musl or macOS
    monkeypatch.delenv("LONGDOC_ALLOCATOR", raising=False)
    with pytest.warns(RuntimeWarning, match="needs glibc's mallopt.*using the system allocator's defaults") as caught:
        assert configure_allocator() == "system"
        assert configure_allocator() == "system"
    assert len(caught) == 1


def test_an_unknown_setting_warns_and_keeps(monkeypatch):
    monkeypatch.setattr(cpu_memory, "_applied", None)
    monkeypatch.setattr(cpu_memory, "_glibc", lambda: None)
    monkeypatch.setenv("LONGDOC_ALLOCATOR", "tcmalloc")
    with pytest.warns(RuntimeWarning) as caught:
        assert configure_allocator() == "system"
    assert "'tcmalloc' is not one of 'keep', 'system'; using 'keep'" in str(caught[0].message)


def test_benchmark_settings_for_fresh_processes():
    assert allocator_environment("thp") == {"LONGDOC_ALLOCATOR": "system", "THP_MEM_ALLOC_ENABLE": "1"}
    assert allocator_environment("keep")["LONGDOC_ALLOCATOR"] == "keep"
    assert resolve_allocator("auto") == ("jemalloc" if find_jemalloc() else "keep")
    with pytest.raises(ValueError, match="allocator must be one of"):
        resolve_allocator("tcmalloc")


@pytest.mark.skipif(find_jemalloc() is None, reason="libjemalloc is not installed on this machine")
def test_a_preloaded_jemalloc_is_used_and_left_alone():
    environment = {**os.environ, **allocator_environment("jemalloc")}
    output = subprocess.run(
        [sys.executable, "-c", "import longdoc.model.attention as a; print(a.configure_allocator());"
         "print(open('/proc/self/maps').read())"],
        env=environment, capture_output=True, text=True, check=True,
    ).stdout
    assert output.startswith("preloaded\n") and "jemalloc" in output
