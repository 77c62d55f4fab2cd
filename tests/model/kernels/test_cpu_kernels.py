"""The C++ kernels themselves (longdoc.model.kernels.cpu): their entry points take their operands
record's fields by name and say which operand is wrong; a build that fails warns once and leaves
the eager backend; a build lock left by a killed build is removed; the products follow the process's
GEMM setting; a built module is loaded from the cache by content."""

import os
import warnings

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
def test_the_kernel_takes_its_products_from_the_process_gemm_setting(kernel, setting):
    # A fresh process (the kernel reads the setting once, when it is loaded): its own products with
    # LONGDOC_GEMM=onednn where the build has AVX-512, BLAS's with LONGDOC_GEMM=blas.
    import subprocess
    import sys

    from longdoc.model import linear

    if setting == "onednn" and not linear._onednn_available():
        pytest.skip("this torch build has no oneDNN linear")
    script = "from longdoc.model.kernels import cpu; print(cpu.compiled().uses_own_products())"
    env = {**os.environ, linear.ENVIRONMENT_VARIABLE: setting}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    built_with_avx512 = "-mavx512f" in kernels._compile_flags()
    assert run.stdout.split()[-1] == str(setting == "onednn" and built_with_avx512)


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
