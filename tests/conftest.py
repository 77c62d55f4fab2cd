"""Shared fixtures and helpers: the real data samples in ../shared/data, MiniLM's tokenizer, a run's logged
losses; a cache folder per test session; the attention's C++ kernels built once per session, before its
tests."""

import contextlib
import fcntl
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from longdoc.model.cpu_blas import configure_blas

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

# MKL_CBWR as the `longdoc` command sets it, before this process's first product (MKL reads it then):
# the tests compare runs in this process with runs of the command in subprocesses (a training run
# killed and resumed against one never stopped), which must pick the same GEMM and get the same bits.
configure_blas()

# Triton reads TRITON_INTERPRET when a kernel is defined, its own library's (tl.zeros, tl.philox, ...)
# on its import, which comes early: transformers imports torch._dynamo, which imports Triton where it
# is installed. So it is set here, before any test module is collected: without a CUDA GPU, Triton's
# interpreter runs the GPU attention's kernels on CPU tensors (tests/model/test_gpu_kernel.py); on a
# GPU they run compiled (or set TRITON_INTERPRET=1 to interpret them there too).
if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def _patch_the_language_once_a_launch() -> None:
    """Triton's interpreter patches triton.language (its builtins made to run on numpy) when a kernel
    is launched, and again on every call of a @triton.jit helper inside it, where the language is
    patched already: inspect.getmembers over tl, tl.tensor and tl.math each time, 40% of the CPU time
    of a gpu-backend model test (cProfile: 9,216 helper calls in 288 programs of one forward pass).
    A helper that sees no language module the launch did not patch skips it (the same patched
    functions run); the launch's own patch and its undoing are Triton's. Where Triton's interpreter
    lacks these functions, nothing changes."""
    try:
        from triton.runtime import interpreter
    except Exception:  # (Triton missing or broken: the tests that need it say so)
        return
    patch_lang, scope_class = getattr(interpreter, "_patch_lang", None), getattr(interpreter, "_LangPatchScope", None)
    executor = getattr(interpreter, "GridExecutor", None)
    if patch_lang is None or scope_class is None or executor is None or getattr(patch_lang, "once_a_launch", False):
        return
    languages = (interpreter.tl, interpreter.tl.core)
    launch = {"running": False, "patched": set()}  # the language modules the running launch patched

    def once_a_launch(fn):
        modules = {id(value) for value in fn.__globals__.values() if any(value is module for module in languages)}
        if launch["running"] and launch["patched"] and modules <= launch["patched"]:
            return scope_class()  # (Triton never restores a helper's scope)
        scope = patch_lang(fn)
        if launch["running"] and not launch["patched"]:  # the launch's own
            launch["patched"] = modules
        return scope

    run = executor.__call__

    def run_once_patched(self, *args, **kwargs):
        launch.update(running=True, patched=set())
        try:
            return run(self, *args, **kwargs)
        finally:
            launch.update(running=False, patched=set())

    once_a_launch.once_a_launch = True
    interpreter._patch_lang = once_a_launch
    executor.__call__ = run_once_patched


if os.environ.get("TRITON_INTERPRET") == "1":
    _patch_the_language_once_a_launch()


# The cache entries a test session shares with the user's cache (LONGDOC_CACHE, else ~/.cache/longdoc):
# each is named by what it was built from, so an entry found is the entry a build would write, and
# rebuilding them would cost every session minutes (the compiled kernels, MiniLM's lifted weights).
SHARED_CACHE_ENTRIES = ("kernels", "lifted")
SESSION_CACHE = pytest.StashKey[Path]()


_session_cache: Path | None = None  # this process's LONGDOC_CACHE before any test set its own


def pytest_configure(config):
    global _session_cache
    _use_a_session_cache(config)
    from longdoc.model.cache import cache_dir

    _session_cache = cache_dir()
    _share_the_cores()
    _compile_in_process()
    _take_ctrl_c()


def pytest_unconfigure(config):
    session_cache = config.stash.get(SESSION_CACHE, None)
    if session_cache is not None:
        shutil.rmtree(session_cache, ignore_errors=True)  # the shared entries are links: left as they are


def _use_a_session_cache(config) -> None:
    """Everything else a session caches (training features, ask's indexes, the demo's model) goes
    into a folder of its own, removed at the end: no test reads what an earlier run left there, and
    the suite writes nothing into the user's cache. Under pytest-xdist the workers inherit the
    controller's folder."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    from longdoc.model.cache import ENVIRONMENT_VARIABLE, cache_dir

    user_cache = cache_dir()
    for name in SHARED_CACHE_ENTRIES:
        (user_cache / name).mkdir(parents=True, exist_ok=True)
    session_cache = _linked(Path(tempfile.mkdtemp(prefix="longdoc-test-cache-")), user_cache)
    os.environ[ENVIRONMENT_VARIABLE] = str(session_cache)
    config.stash[SESSION_CACHE] = session_cache


def _linked(cache: Path, shared: Path) -> Path:
    """`cache` (made if missing) with `shared`'s SHARED_CACHE_ENTRIES linked into it (where not yet)."""
    cache.mkdir(parents=True, exist_ok=True)
    for name in SHARED_CACHE_ENTRIES:
        if not (cache / name).is_symlink():
            (cache / name).symlink_to((shared / name).resolve(), target_is_directory=True)
    return cache


def new_cache(path: Path) -> Path:
    """A cache folder of a test's own at `path` (for LONGDOC_CACHE; the same folder if called again)
    that shares the session's compiled kernels and lifted MiniLM: without them every command run on
    it compiled the attention kernels again (about a minute on two cores)."""
    return _linked(path, _session_cache)


@contextlib.contextmanager
def run_folder(tmp_path_factory, name: str) -> Iterator[Path]:
    """A folder `name` of this test run, held locked: pytest-xdist's workers share it (the folder above
    a worker's temporary folder is the run's), so what one worker builds there the others find."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    folder = base / name
    folder.mkdir(exist_ok=True)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield folder


def _share_the_cores() -> None:
    """Under pytest-xdist, each worker uses its share of the cores. With every worker on all of them,
    OpenMP's threads spin at their barriers while the other worker holds the core they wait for, and
    a small model's training slows down many times over (docs/benchmarks.md, "The test suite").
    OMP_NUM_THREADS passes the share on to the commands tests run as subprocesses; a value the caller
    set is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2 or "OMP_NUM_THREADS" in os.environ:
        return
    import torch

    share = max(1, len(os.sched_getaffinity(0)) // workers)
    os.environ["OMP_NUM_THREADS"] = str(share)
    torch.set_num_threads(share)


def _take_ctrl_c() -> None:
    """This process, and the commands tests start, stop on SIGINT as a program run from a terminal does.
    A test run started in the background of a non-interactive shell (`cmd &` in a script, nohup) is
    handed SIGINT ignored, and passes that on to every child: the tests that send a command Ctrl-C
    (SIGINT) then saw it run to the end. Python's handler here is not inherited: a child starts with
    SIGINT at its default, which Python turns into KeyboardInterrupt, as under a terminal."""
    import signal

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _compile_in_process() -> None:
    """Inductor compiles its C++ in the test's own process (TORCHINDUCTOR_COMPILE_THREADS=1; a value
    the caller set is kept): its pool of compile workers, each importing torch, cost more CPU than
    they saved on the few kernels of a test's graphs, with the suite's workers already on the cores.
    Read when torch._inductor.config is first imported, which the test modules do (transformers)."""
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


@pytest.fixture
def without_triton_interpreter(monkeypatch):
    """A user's environment, without the TRITON_INTERPRET=1 set above: there the gpu attention backend
    refuses CPU tensors (with it, its interpreter mode runs them: longdoc/model/backends/gpu.py)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data beside the checkout. Absent in a user's clone: skip; absent under CI: fail."""
    if not SHARED_DATA.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but the real data samples are missing: {SHARED_DATA}")
        pytest.skip(f"real data samples not found at {SHARED_DATA} (they live beside the checkout, in ../shared/data)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tokenizer():
    """MiniLM's uncased WordPiece tokenizer (the default one), loaded once."""
    from longdoc.convert.pretrained import default_tokenizer

    return default_tokenizer()


def logged_losses(out: Path) -> list[float]:
    """The training losses a run logged in its train_log.jsonl, in order."""
    return [record["loss"] for record in map(json.loads, (out / "train_log.jsonl").read_text().splitlines())
            if "loss" in record]


@pytest.fixture
def linear_backend(monkeypatch):
    """A function that forces LONGDOC_GEMM for the test: the choice is cached per process, so the
    cache is cleared on the way in and out."""
    from longdoc.model import linear

    def use(name: str) -> None:
        monkeypatch.setenv(linear.ENVIRONMENT_VARIABLE, name)
        linear.backend.cache_clear()

    yield use
    linear.backend.cache_clear()


# The variables that decide which code MKL, oneDNN, torch and the kernels run, and on how many threads,
# in the commands tests start as subprocesses (they inherit this process's environment).
_NUMERICS_VARIABLES = ("MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "MKL_NUM_THREADS", "ONEDNN_MAX_CPU_ISA",
                       "ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS", "LONGDOC_GEMM", "LONGDOC_KERNELS")


@pytest.fixture(autouse=True)
def _numerics_variables_left_as_found():
    """Fails a test that leaves one of _NUMERICS_VARIABLES changed (and puts it back). MKL reads
    MKL_CBWR at a process's first product, so a value set later changes the bits of the subprocesses
    only: on an Intel CPU a leaked MKL_CBWR=AVX2 made a training run killed in a subprocess and
    resumed here end on other last bits than one run here throughout. monkeypatch.delenv of a
    variable that is not set records nothing, so a command run in-process after it sets the variable
    for every test after."""
    before = {name: os.environ.get(name) for name in _NUMERICS_VARIABLES}
    yield
    changed = {name: (value, os.environ.get(name)) for name, value in before.items() if os.environ.get(name) != value}
    for name, (value, _) in changed.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    assert not changed, "the test left variables that subprocesses inherit changed (before, after): " + \
        ", ".join(f"{name} {pair}" for name, pair in changed.items())


def pytest_collection_finish(session) -> None:
    """Build the attention's C++ kernels once, before the first test, when the session's tests use the
    encoder (their modules imported it) and the kernels are not in the cache yet: built inside the
    first test that runs the encoder on the CPU, the build (minutes on two cores) was that test's
    time. Built or found, they are loaded here, in each process: a test that points LONGDOC_CACHE at
    a folder of its own then runs them as they are, where its first use in the process compiled them
    again into that folder. Nothing happens with LONGDOC_KERNELS=0."""
    if not session.items or "longdoc.model.modeling" not in sys.modules:
        return
    from longdoc.model.kernels import cpu

    if not cpu.enabled():
        return
    if cpu.is_built():
        cpu.compiled()
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    say = reporter.write_line if reporter is not None else (lambda line: print(line, file=sys.stderr))
    say(f"building the attention's C++ kernels once for this session, into {cpu.build_location()[0]} (cached by "
        "content; LONGDOC_KERNELS=0 skips it)")
    started = time.perf_counter()
    failure = cpu.failure()
    say(f"  {'could not build them: ' + failure if failure else 'built'} ({time.perf_counter() - started:.0f} s)")
