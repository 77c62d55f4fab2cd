"""The CPU attention kernels' builds side by side: each entry point of each build run on the same
operands, alternated call by call in one process, so that load on the machine falls on all builds
alike (timings of separate processes on a shared machine move by more than the builds differ).

  python scripts/bench_kernel_builds.py [--length 4096] [--talking-heads] [--threads 1] [--repeats 9]
                                        [--build LABEL=FOLDER ...]

The operands are those the benchmark's model (ours(res), or ours(res,th), MiniLM's shape) passes
the kernels in one forward+backward and one forward without autograd: one call of each kind (entry
point; long or global softmax; with or without carried scores; weights kept or not). The builds:
this checkout's for AVX-512 and for AVX2 where they are in the cache (a process run once with
ATEN_CPU_CAPABILITY=avx2 builds the latter), and each --build folder (another checkout's build in
the cache, say), every one with its own products on where the kernels use them (`wants_own_products()`).
"""

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch

from longdoc.bench.models import build_runner
from longdoc.bench.settings import OURS_RESIDUAL, OURS_RESIDUAL_TALKING, TRAIN, BenchSettings, Job
from longdoc.bench.worker import step_for
from longdoc.model.kernels import cpu as kernels


def copied(arguments: dict) -> dict:
    """The keyword arguments of a call, each tensor cloned (strides kept), those that were one tensor
    (summed_out written over carried, as the encoder passes them without autograd) still one."""
    clones = {}

    def copy(value):
        if not isinstance(value, torch.Tensor):
            return value
        key = (value.data_ptr(), value.shape, value.stride())
        if key not in clones:
            clones[key] = value.clone()
        return clones[key]

    return {key: copy(value) for key, value in arguments.items()}


@contextlib.contextmanager
def recorded_calls(calls: list):
    """Inside, every call of the kernels runs as usual and the first of each kind is appended to
    `calls` as (entry point, its keyword arguments copied)."""
    module, seen = kernels.compiled(), set()

    class Recorder:
        def __getattr__(self, name):
            def call(**arguments):
                getattr(module, name)(**arguments)
                kind = (name, arguments["window_block"] > 0, arguments["carried"] is not None if "carried" in arguments
                        else None, arguments.get("probs_out") is not None)
                if kind not in seen:
                    seen.add(kind)
                    calls.append((name, copied(arguments)))
            return call

    compiled = kernels.compiled
    kernels.compiled = lambda: Recorder()
    try:
        yield
    finally:
        kernels.compiled = compiled


def call_label(name: str, arguments: dict) -> str:
    softmax = "long" if arguments["window_block"] else "global"
    terms = [term for term, key in (("carried", "carried"), ("weights kept", "probs_out")) if arguments.get(key) is not None]
    return f"{name} {softmax}" + (f" ({', '.join(terms)})" if terms else "")


def builds(extra: list[str]) -> dict:
    """{label: module}: this checkout's AVX-512 and AVX2 builds where built, then each LABEL=FOLDER."""
    folders = {capability: kernels.build_location(capability) for capability in ("AVX512", "AVX2")}
    found = {}
    for capability, (folder, name) in folders.items():
        path = next(iter(sorted(folder.glob(f"{name}*.so"))), None)
        if path is not None:
            found[capability] = kernels.load_built(path, name)
    for item in extra:
        label, _, folder = item.partition("=")
        path = next(iter(sorted(Path(folder).glob("*.so"))), None)
        if path is None:
            raise SystemExit(f"kernel_builds: --build {item}: no built module (*.so) in {folder}")
        found[label] = kernels.load_built(path, path.name.split(".")[0])
    for module in found.values():
        module.use_own_products(on=kernels.wants_own_products())
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench_kernel_builds.py", description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--talking-heads", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--build", action="append", default=[], metavar="LABEL=FOLDER")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    built = kernels.compiled() is not None  # (built first where it is not: then builds() finds it)
    modules = builds(args.build)
    if not built or not modules:
        print(f"kernel_builds: no kernel build to time ({kernels.failure()})", file=sys.stderr)
        return 1
    variant = OURS_RESIDUAL_TALKING if args.talking_heads else OURS_RESIDUAL
    runner = build_runner(Job(BenchSettings(lengths=(args.length,), attention="cpu"), variant, args.length, TRAIN))
    calls = []
    with recorded_calls(calls):
        step_for(runner, TRAIN)()
        runner.model.eval()
        with torch.inference_mode():
            runner.model(**runner.inputs)
    print(f"{variant.name} at {args.length} tokens, {args.threads} threads: ms per call, median of {args.repeats}, "
          f"the builds alternated call by call")
    widths = {label: max(10, len(label)) + 2 for label in modules}
    print("call".ljust(58) + "".join(label.rjust(widths[label]) for label in modules))
    for name, arguments in calls:
        seconds = {label: [] for label in modules}
        for _ in range(args.repeats):
            for label, module in modules.items():
                start = time.perf_counter()
                getattr(module, name)(**arguments)
                seconds[label].append(time.perf_counter() - start)
        print(call_label(name, arguments).ljust(58)
              + "".join(f"{1e3 * statistics.median(seconds[label]):.1f}".rjust(widths[label]) for label in modules))
    return 0


if __name__ == "__main__":
    sys.exit(main())
