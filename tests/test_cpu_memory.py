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


# In a fresh process: run `setup`, then GELU (through oneDNN on CPU) over 40 shapes, as batches of
# texts of every length have; print the megabytes the process grew by after the largest one (the
# tensors' own memory, kept by the command's allocator setting).
GELU_OF_EVERY_SHAPE = """
import contextlib, io, torch
{setup}
def resident_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
torch.set_num_threads(1)
torch.nn.functional.gelu(torch.randn(64, 40, 1536))
before = resident_mib()
for length in range(1, 40):
    torch.nn.functional.gelu(torch.randn(64, length, 1536))
print(round(resident_mib() - before))
"""
RUN_THE_INDEX_COMMAND = """
from longdoc.cli import main
with contextlib.redirect_stderr(io.StringIO()):
    assert main(["index"]) == 2  # no paths: refused, after the command's process settings
"""


def growth_of_every_shape(setup: str) -> int:
    env = {key: value for key, value in os.environ.items() if key != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    return int(subprocess.run([sys.executable, "-c", GELU_OF_EVERY_SHAPE.format(setup=setup)], env=env,
                              capture_output=True, text=True, check=True).stdout)


def test_the_commands_that_embed_texts_do_not_grow_with_every_shape():
    cached = growth_of_every_shape(RUN_THE_COMMAND)
    if cached < 100:
        pytest.skip(f"this torch's GELU grew the process by {cached} MiB over 40 shapes: no kernel cache to bound")
    assert growth_of_every_shape(RUN_THE_INDEX_COMMAND) < 30
