"""Build the GPU attention's kernels for an H100 (sm_90) with Triton's compiler, without a GPU, and
print one JSON line per kernel built: its name, dtype and flags, the shared memory a block of it
takes, its registers and the stack its spills use (from the cubin, by the cuobjdump Triton ships),
and whether it must not spill (must_not_spill; the exit status is 1 where one of those does).

Run as `python -m tests.model.gpu_kernel_builds` (test_gpu_kernel.py does, in a process of its own:
the kernels must be imported without TRITON_INTERPRET). TritonSoftmax runs forward and backward on
CPU tensors over a few configurations, as the attention layer calls it; a stand-in driver names the
GPU, and each kernel launch is replaced by a build (Triton's `warmup`): nothing runs. This checks
what the interpreter cannot: that the kernels are valid GPU programs (types, layouts, 3-D dots,
reshapes, tl.dot's least sizes) and what they take of the GPU's resources.
"""

import json
import os
import re
import subprocess
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "0"
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # (Triton 3.9 warns when it is unset)

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from triton.runtime.jit import JITFunction

from longdoc.model.backends.gpu import TritonSoftmax
from longdoc.model.kernels.gpu import softmax as gpu_softmax
from longdoc.model.kernels.gpu.records import Flags
from tests.model.one_softmax import Case, operands

H100 = GPUTarget("cuda", 90, 32)
# (case, dtype, drop probability): the layer's usual ones in bfloat16 and float16 at ETC-base's and
# MiniLM's head sizes (64, 32), windows whose blocks take tiles of 32 (radius 84) and of 16
# queries (radius 79), rows of 256 keys or more (the widest key tiles); talking heads with ETC-base's
# 12 heads (a program holds all of them); the heaviest in float32.
CONFIGURATIONS = [
    (Case("long", length=300, radius=84, hard=False, head_size=64), torch.bfloat16, 0.1),
    (Case("global", length=300, radius=84, num_globals=16, hard=False, head_size=64), torch.bfloat16, 0.1),
    (Case("long", length=300, radius=79, num_globals=16, hard=False, head_size=32, relative=False), torch.float16,
     0.0),
    (Case("global", residual=False, head_size=64), torch.float32, 0.0),
    (Case("long", talking=True, heads=12, head_size=64), torch.bfloat16, 0.1),
    (Case("global", talking=True, residual=False, heads=12, head_size=64), torch.float32, 0.0),
]


def must_not_spill(build: dict) -> bool:
    """Whether a build is one whose values must all stay in registers: every kernel in bfloat16 and
    float16 (what training under autocast and bfloat16 prediction run). float32's exact products on
    the CUDA cores take more registers than the tensor cores' (printed, not held)."""
    return build["dtype"] != "float32"


class TargetOnly:
    """The part of Triton's driver that building a kernel asks for: the target, no device."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return H100


def resources(kernel) -> dict:
    """Registers and spill stack of a built kernel, from its cubin."""
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([cuobjdump, "-res-usage", cubin.name], capture_output=True, text=True).stdout
    found = {name: re.search(rf"{name}:(\d+)", usage) for name in ("REG", "STACK")}
    return {name.lower(): int(match.group(1)) if match else None for name, match in found.items()}


def main() -> int:
    """Builds every kernel of CONFIGURATIONS, prints each build; exit status 1 where one that must
    not spill (must_not_spill) does."""
    driver.set_active(TargetOnly())
    built = {}
    dtype = None  # (the configuration's, which the kernels' flags do not name)

    def build_instead_of_launching(kernel_function, grid):
        def launch(*args, **kwargs):
            kernel = kernel_function.warmup(*args, grid=grid, **kwargs)
            flags = next({name: value.value for name, value in arg._asdict().items()}
                         for arg in args if isinstance(arg, Flags))
            key = json.dumps([kernel_function.fn.__name__, dtype, flags], sort_keys=True)
            if key not in built:
                build = dict(kernel=kernel_function.fn.__name__, dtype=dtype, flags=flags,
                             shared=kernel.metadata.shared, warps=kernel.metadata.num_warps, **resources(kernel))
                built[key] = dict(build, must_not_spill=must_not_spill(build))
                print(json.dumps(built[key]), flush=True)
        return launch

    JITFunction.__getitem__ = build_instead_of_launching
    gpu_softmax._check_device = lambda tensor: None  # (CPU tensors: only their dtypes and strides matter here)
    for case, dtype_, drop_probability in CONFIGURATIONS:
        dtype = str(dtype_).removeprefix("torch.")
        ops = operands(case).with_dropout(drop_probability)
        context, summed = TritonSoftmax.apply(*ops.inputs(dtype_, "cpu"), ops.settings_for(dtype_, "cpu"))
        (context.float().sum() + (0 if summed is None else summed.float().sum())).backward()
    spilled = [build for build in built.values() if build["must_not_spill"] and build["stack"] != 0]
    for build in spilled:
        print(f"gpu_kernel_builds: {build['kernel']} ({build['dtype']}, {build['flags']}) spills registers: "
              f"{build['stack']} bytes of stack", file=sys.stderr)
    return 1 if spilled else 0


if __name__ == "__main__":
    sys.exit(main())
