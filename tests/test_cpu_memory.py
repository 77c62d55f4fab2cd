"""Allocator settings handed to new processes (longdoc.cpu_memory)."""

import os
import subprocess
import sys

import pytest

from longdoc.cpu_memory import allocator_environment, find_jemalloc, resolve_allocator


def test_each_setting_names_its_variables():
    assert allocator_environment("thp") == {"THP_MEM_ALLOC_ENABLE": "1"}
    assert allocator_environment("system") == {"THP_MEM_ALLOC_ENABLE": "0"}
    assert resolve_allocator("auto") == ("jemalloc" if find_jemalloc() else "thp")
    with pytest.raises(ValueError, match="allocator must be one of"):
        resolve_allocator("tcmalloc")


@pytest.mark.skipif(find_jemalloc() is None, reason="libjemalloc is not installed on this machine")
def test_jemalloc_is_loaded_in_a_new_process():
    environment = {**os.environ, **allocator_environment("jemalloc")}
    maps = subprocess.run(
        [sys.executable, "-c", "print(open('/proc/self/maps').read())"],
        env=environment, capture_output=True, text=True, check=True,
    ).stdout
    assert "jemalloc" in maps
    assert environment["MALLOC_CONF"] == "dirty_decay_ms:-1,muzzy_decay_ms:-1"
