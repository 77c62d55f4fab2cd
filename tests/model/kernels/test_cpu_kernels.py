"""The C++ kernels themselves (longdoc.model.kernels.cpu): their entry points take their operands
record's fields by name and say which operand is wrong; a build that fails (a compiler without the
flags) or an ATEN_CPU_CAPABILITY the CPU lacks warns once and leaves the eager backend; a build lock left by a killed build is removed; the products follow the process's
GEMM setting; a built module is loaded from the cache by content."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from longdoc.model.backends import AttentionBackendError
from longdoc.model.kernels import cpu as kernels
from tests.model.conftest import make_inputs, tiny_config
from tests.model.test_attention import make_model


def test_a_kernel_that_cannot_be_built_warns_once_and_the_eager_path_serves(monkeypatch, tmp_path,
                                                                           without_triton_interpreter):
    from torch.utils import cpp_extension

    def no_compiler(**kwargs):  # what torch raises when ninja cannot run the compiler (its command line first)
        raise RuntimeError("Error building extension 'x': [1/2] c++ -O3 -c attention.cpp\nFAILED: [code=127] "
                           "attention.o\n/bin/sh: 1: c++: not found\nninja: build stopped: subcommand failed.")

    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    monkeypatch.setenv("LONGDOC_CACHE", str(tmp_path))
    kernels._build.cache_clear()
    try:
        model = make_model(tiny_config()).float()
        inputs = make_inputs(2, 13, 4, padding=True, structure=True)
        with pytest.warns(UserWarning, match=r"could not be built \(/bin/sh: 1: c\+\+: not found\); using the eager"):
            built = model(**inputs)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no second warning
            again = model(**inputs)
        torch.testing.assert_close(built.long_hidden_state, again.long_hidden_state, atol=0, rtol=0)
        model.set_attention_backend("cpu")  # asked for by name, the backend is refused with the reason
        with pytest.raises(AttentionBackendError, match=r"attention backend 'cpu' cannot run on cpu in float32: the "
                                                        r"C\+\+ kernels could not be built here \(/bin/sh: 1: c\+\+: "
                                                        r"not found\); there eager, dense can"):
            model(**inputs)
    finally:
        kernels._build.cache_clear()


def test_a_capability_the_cpu_lacks_leaves_the_eager_path_with_one_warning(monkeypatch, without_triton_interpreter):
    # torch takes ATEN_CPU_CAPABILITY at its word (avx512 on an AVX2 CPU): kernels built for that level
    # would stop the process on their first instruction, so they are not built.
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in kernels._CPU_HAS:
        pytest.skip(f"torch dispatches to {capability} here: the kernels use no vector instructions")
    monkeypatch.setitem(kernels._CPU_HAS, capability, lambda: False)  # a CPU without it
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability.lower())
    kernels._build.cache_clear()
    try:
        model = make_model(tiny_config()).float()
        inputs = make_inputs(2, 13, 4, padding=True, structure=True)
        why = f"ATEN_CPU_CAPABILITY={capability.lower()} asks for {capability}, which this CPU lacks"
        with pytest.warns(UserWarning, match=rf"could not be built \({why}\); using the eager PyTorch path"):
            served = model(**inputs)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no second warning
            model(**inputs)
        assert kernels.failure() == why
        model.set_attention_backend("eager")
        torch.testing.assert_close(served.long_hidden_state, model(**inputs).long_hidden_state, atol=0, rtol=0)
    finally:
        kernels._build.cache_clear()


@pytest.mark.slow
def test_a_compiler_that_fails_leaves_the_eager_path_with_one_warning(tmp_path):
    # A compiler that does not know the kernels' flags (CXX names the compiler torch's build runs).
    from torch.utils import cpp_extension

    compiler = tmp_path / "c++"
    compiler.write_text("#!/bin/sh\n"
                        "case \"$*\" in *version*) echo 'c++ (GCC) 12.2.0'; exit 0;; esac\n"  # torch asks first
                        "echo \"c++: error: unrecognized command-line option '-mavx2'\" >&2\n"
                        "exit 1\n")
    compiler.chmod(0o755)
    script = ("from tests.model.conftest import make_inputs, tiny_config\n"
              "from tests.model.test_attention import make_model\n"
              "model = make_model(tiny_config()).float()\n"
              "inputs = make_inputs(2, 13, 4, padding=True, structure=True)\n"
              "first, second = model(**inputs), model(**inputs)\n"
              "print(bool(first.long_hidden_state.isfinite().all()))\n")
    env = {**os.environ, "CXX": str(compiler), "LONGDOC_CACHE": str(tmp_path / "cache"), "LONGDOC_KERNELS": "1"}
    env.pop("TRITON_INTERPRET", None)
    run = subprocess.run([sys.executable, "-c", script], env=env, cwd=Path(__file__).resolve().parents[3],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.split() == ["True"], run.stderr[-3000:]
    warned = [line for line in run.stderr.splitlines() if "attention kernels could not be built" in line]
    assert len(warned) == 1, run.stderr[-3000:]
    if cpp_extension.is_ninja_available():  # (without ninja, torch's build stops before the compiler)
        assert "unrecognized command-line option '-mavx2'" in warned[0], warned[0]


def test_a_built_kernel_is_loaded_from_the_cache_as_it_is(kernel, monkeypatch):
    # The cache is keyed by the sources' contents, flags and torch: a checkout in another folder (or a
    # reinstall) loads the module built from the same sources, without ninja, which would build it
    # again for sources at other paths.
    from torch.utils import cpp_extension

    def build(**kwargs):
        raise AssertionError("built again")

    monkeypatch.setattr(cpp_extension, "load", build)
    kernels._build.cache_clear()
    try:
        assert kernels.is_built()
        module = kernels.compiled()
        assert module is not None and kernels.failure() is None
        assert module.__file__.startswith(str(kernels.build_location()[0]))
    finally:
        kernels._build.cache_clear()



@pytest.mark.parametrize("setting", ["blas", "onednn"])
def test_the_kernel_takes_its_products_from_the_cpu_whatever_the_linear_layers_use(kernel, setting):
    # A fresh process (the kernel decides once, when it is loaded): its own products on x86 CPUs not
    # made by Intel where the build has AVX-512 or AVX2, BLAS's elsewhere, with either LONGDOC_GEMM.
    from longdoc.model import cpu_blas
    from longdoc.model import linear

    script = "from longdoc.model.kernels import cpu; print(cpu.compiled().uses_own_products())"
    env = {**os.environ, linear.ENVIRONMENT_VARIABLE: setting}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    built_with_vectors = any(flag in kernels._compile_flags() for flag in ("-mavx512f", "-mavx2"))
    assert run.stdout.split()[-1] == str(cpu_blas.mkl_keeps_to_avx2() and built_with_vectors)


def one_softmax(**changes) -> dict:
    """attention_forward's arguments for one small softmax (then `changes`): 5 queries of 2 heads
    (d = 8) over all of 3 first keys and 4 second keys, the weights kept."""
    generator = torch.Generator().manual_seed(0)
    rows = lambda length: torch.randn(1, 2, length, 8, generator=generator)
    arguments = dict(query=rows(5), query_scale=0.5, first_keys=rows(3), first_values=rows(3), window_block=0,
                     second_keys=rows(4), second_values=rows(4), relative=None, ids=None, carried=None,
                     mask_bias=torch.zeros(1, 5, 7), scale=1.0, keep=None, keep_scale=1.0, summed_out=None,
                     probs_out=torch.empty(1, 2, 5, 7), context_out=torch.empty(1, 2, 5, 8), key_ranges=None)
    return {**arguments, **changes}


def test_the_kernel_takes_its_arguments_by_name_and_says_which_is_wrong(kernel):
    arguments = one_softmax()
    arguments["mask_bias"][0, :, 6] = -10000.0  # the last second key masked
    kernel.attention_forward(**arguments)
    keys = torch.cat([arguments["first_keys"], arguments["second_keys"]], 2)
    values = torch.cat([arguments["first_values"], arguments["second_values"]], 2)
    probs = torch.softmax(0.5 * arguments["query"] @ keys.transpose(-1, -2) + arguments["mask_bias"][:, None], -1)
    torch.testing.assert_close(arguments["probs_out"], probs)
    torch.testing.assert_close(arguments["context_out"], probs @ values)

    with pytest.raises(TypeError):  # no binding by position
        kernel.attention_forward(*arguments.values())
    with pytest.raises(TypeError):  # nor under a name the kernel does not have
        kernel.attention_forward(**{"queries" if name == "query" else name: value for name, value in arguments.items()})
    swapped = one_softmax()
    swapped["first_values"], swapped["second_values"] = swapped["second_values"], swapped["first_values"]
    with pytest.raises(RuntimeError, match=r"keys and values differ in length: first_keys \[1, 2, 3, 8\], "
                                           r"first_values \[1, 2, 4, 8\]"):
        kernel.attention_forward(**swapped)
    with pytest.raises(RuntimeError, match=r"mask_bias must be \[B, M, N\] = \[1, 5, 7\], not \[1, 5, 6\]"):
        kernel.attention_forward(**one_softmax(mask_bias=torch.zeros(1, 5, 6)))
    with pytest.raises(RuntimeError, match="ids must be Int, not Long"):
        kernel.attention_forward(**one_softmax(relative=torch.zeros(1, 2, 5, 3),
                                               ids=torch.zeros(1, 5, 7, dtype=torch.long)))
    with pytest.raises(TypeError, match="missing keyword argument 'key_ranges'"):  # every field, by name
        kernel.attention_forward(**{name: value for name, value in arguments.items() if name != "key_ranges"})
    with pytest.raises(TypeError, match="unexpected keyword argument 'pre'"):  # the plain softmax has no mixes
        kernel.attention_forward(**arguments, pre=None)
    with pytest.raises(RuntimeError, match="talking_heads_forward needs pre and post"):
        kernel.talking_heads_forward(**arguments, pre=None, post=None)


def test_a_build_lock_left_by_a_killed_build_is_removed_and_a_fresh_one_kept(tmp_path):
    lock = tmp_path / "lock"
    lock.touch()
    assert not kernels.clear_stale_lock(tmp_path) and lock.exists()  # a build may still be running
    old = lock.stat().st_mtime - kernels.STALE_LOCK_SECONDS - 60
    os.utime(lock, (old, old))
    with pytest.warns(UserWarning, match=rf"removing {lock}, left 16 minutes ago by a kernel build that did not finish"):
        assert kernels.clear_stale_lock(tmp_path)
    assert not lock.exists()
    assert not kernels.clear_stale_lock(tmp_path)  # nothing to remove
