"""The allocator setting the entry points apply (longdoc.cpu_memory), which importing the library
leaves alone, and the settings handed to the benchmark's fresh processes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from longdoc import cpu_memory
from longdoc.cpu_memory import allocator_environment, configure_allocator, find_jemalloc, resolve_allocator

# In a fresh process: run `setup`, fill a 256 MiB tensor twice (the heap grows to hold it), then
# print the setting in effect and the fewest page faults of four more fills. Memory kept by malloc
# is already mapped; memory given back to the kernel is faulted in again, page by page. (The
# fewest, because the heap may need to grow twice: a small block allocated after the first tensor
# keeps its freed 256 MiB from the top, and torch's 64-byte-aligned request needs a little more.)
REFAULTS = """
import resource, torch
{setup}
from longdoc import cpu_memory
def faults_of_a_fill():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(64 * 2**20)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults_of_a_fill()
faults_of_a_fill()
print(cpu_memory._applied, min(faults_of_a_fill() for _ in range(4)))
"""
PAGES = 256 * 2**20 // 4096
THP_ALWAYS = "[always]" in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
# The `longdoc` command, as far as it goes before a subcommand runs.
RUN_THE_COMMAND = """
import contextlib, io
from longdoc.cli import main
with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):
    main(["--help"])
"""
# The library as a user's script takes it: the model imported and built.
IMPORT_AND_BUILD_THE_MODEL = """
import longdoc.model.attention, longdoc.model.kernels.cpu, longdoc.model.linear
from longdoc import GlobalLocalConfig, GlobalLocalModel
GlobalLocalModel(GlobalLocalConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=32, long_max_len=64, global_max_len=16, max_position_embeddings=64))
"""


def fewest_refaults(setup: str, **environment) -> tuple[str, int]:
    env = {**os.environ, "THP_MEM_ALLOC_ENABLE": "0", **environment}
    env.pop("LD_PRELOAD", None)
    applied, faults = subprocess.run(
        [sys.executable, "-c", REFAULTS.format(setup=setup)], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    return applied, int(faults)


def test_the_longdoc_command_keeps_freed_memory_and_system_opts_out():
    applied, faults = fewest_refaults(RUN_THE_COMMAND)
    assert applied == "keep" and faults < PAGES // 20
    applied, faults = fewest_refaults(RUN_THE_COMMAND, LONGDOC_ALLOCATOR="system")
    assert applied == "system"
    if not THP_ALWAYS:  # with 2 MiB pages everywhere the kernel itself faults 512x less
        assert faults > PAGES // 2


def test_importing_and_building_the_model_leaves_the_allocator_alone():
    applied, faults = fewest_refaults(IMPORT_AND_BUILD_THE_MODEL)
    assert applied == "None"  # configure_allocator never ran
    if not THP_ALWAYS:  # glibc's defaults: the freed tensor was unmapped and is faulted in again
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
        [sys.executable, "-c", "from longdoc.cpu_memory import configure_allocator; print(configure_allocator());"
         "print(open('/proc/self/maps').read())"],
        env=environment, capture_output=True, text=True, check=True,
    ).stdout
    assert output.startswith("preloaded\n") and "jemalloc" in output
