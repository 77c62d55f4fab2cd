"""Where, in what precision and with which attention backend a trained model predicts: `--device`,
`--dtype` and `--attention` of `longdoc predict` and `longdoc ask`.

`resolve_placement(device, dtype)` turns the two option strings into a torch device and dtype, or
an InputError naming the option and what this machine offers; `place_model` moves a loaded model
there, refusing one whose weights were never loaded (parameters on the "meta" device). Inputs follow
the model: `TaskModel.forward_rows` moves each batch to the model's device and brings floating
outputs back to the CPU as float32, so the decoders' arithmetic is the same in every precision.

The default device is the fastest one torch finds: CUDA, else Apple's MPS, else the CPU; the
default dtype float32. bfloat16 on the CPU is refused where the CPU has no bfloat16 instructions
(`cpu_bfloat16_refusal`): there it is slower than float32. The attention backend
(longdoc.model.backends) is the model's own (`attention_backend` in its config, normally auto: on the
CPU the compiled kernels serve float32, and bfloat16 through float32 copies; float16 runs the eager
backend) unless `--attention` names one; `check_attention` refuses one that cannot run on the device
in the dtype, naming what can.

The flags themselves are the command line's (longdoc.commands.model_flags); torch is imported inside
the functions, so that the command line can read DTYPE_NAMES and DEVICE_FORMS for `longdoc --help`.
"""

import re

from longdoc.errors import InputError
from longdoc.model.backends import BACKEND_NAMES

DTYPE_NAMES = ("float32", "bfloat16", "float16")
DEVICE_FORMS = "cpu, cuda, cuda:N, mps"
_DEVICE_PATTERN = re.compile(r"(cpu|cuda|mps)(?::(\d+))?")


def check_attention(name: str, device, dtype, source) -> None:
    """InputError naming `source` (the option or the model folder) when attention backend `name` cannot
    run on `device` in `dtype`: one line saying which can."""
    from longdoc.model.backends.resolution import refusal

    if name not in BACKEND_NAMES:
        raise InputError(f"{source}: {name!r} is not an attention backend; use one of {', '.join(BACKEND_NAMES)}")
    why = refusal(name, device, dtype)
    if why is not None:
        raise InputError(f"{source}: {why}")


def default_device() -> str:
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def _cuda_devices(count: int) -> str:
    named = ", ".join(f"cuda:{index}" for index in range(count))
    return f"{count} CUDA device{'s' if count != 1 else ''} ({named})"


def resolve_device(name: str | None):
    """The torch.device `--device name` names (None: `default_device()`); InputError when the name is
    not one of DEVICE_FORMS or this machine lacks the device."""
    import torch

    name = default_device() if name is None else name
    match = _DEVICE_PATTERN.fullmatch(name)
    if match is None:
        raise InputError(f"--device {name}: not a device name; use one of {DEVICE_FORMS}")
    kind, index = match.group(1), match.group(2)
    if kind == "cuda":
        if not torch.cuda.is_available():
            reason = "torch was built without CUDA" if torch.version.cuda is None else "torch finds no CUDA device"
            raise InputError(f"--device {name}: this machine has no CUDA device ({reason}); use --device cpu")
        count = torch.cuda.device_count()
        if index is not None and int(index) >= count:
            raise InputError(f"--device {name}: this machine has {_cuda_devices(count)}")
        return torch.device("cuda", int(index or 0))
    if kind == "mps" and not torch.backends.mps.is_available():
        raise InputError(f"--device {name}: this machine has no MPS device (Apple silicon GPU); use --device cpu")
    if index is not None and int(index) != 0:
        raise InputError(f"--device {name}: there is one {kind} device, {kind} ({kind}:0)")
    return torch.device(kind)


def cpu_bfloat16_refusal() -> str | None:
    """Why a model would predict slower on this CPU in bfloat16 than in float32, or None where it is
    faster: with bfloat16 instructions the products run in bfloat16 and the attention in the float32
    kernels; without them every bfloat16 product is emulated (docs/benchmarks.md, "Precision on the CPU")."""
    from longdoc.model import linear

    if linear.bfloat16_instructions():
        return None
    return "this CPU has no bfloat16 instructions (AVX512_BF16 or AMX), where bfloat16 runs slower than float32"


def resolve_placement(device: str | None, dtype: str | None):
    """(torch.device, torch.dtype) of `--device` and `--dtype` (None: their defaults); InputError
    when the device is absent or cannot run the dtype, or the dtype would be slower than float32 there
    (bfloat16 on a CPU without its instructions)."""
    import torch

    where = resolve_device(device)
    dtype = dtype or "float32"
    if dtype not in DTYPE_NAMES:
        raise InputError(f"--dtype {dtype}: use one of {', '.join(DTYPE_NAMES)}")
    if dtype == "bfloat16" and where.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise InputError(f"--dtype bfloat16: {where} ({torch.cuda.get_device_name(where)}) cannot run bfloat16; "
                         "use --dtype float16 or float32")
    if dtype == "bfloat16" and where.type == "cpu":
        why = cpu_bfloat16_refusal()
        if why is not None:
            raise InputError(f"--dtype bfloat16 (--bf16): {why}; use float32 (the default)")
    return where, getattr(torch, dtype)


def place_model(model, device, dtype, source, attention: str | None = None) -> object:
    """`model` moved to `device` in `dtype` (floating parameters and buffers), in eval mode, its
    attention computed by backend `attention` (None: the one its config names). A model with
    parameters on the "meta" device (no weights: a loader that skipped them), or an attention backend
    that cannot run there, is refused, naming `source` (its folder) or --attention, before anything
    runs on it."""
    on_meta = [name for name, tensor in [*model.named_parameters(), *model.named_buffers()] if tensor.is_meta]
    if on_meta:
        raise InputError(f"{source}: the model's weights were not loaded ({len(on_meta)} tensors on the meta "
                         f"device, e.g. {on_meta[0]}); cannot predict with it")
    if attention is None:
        check_attention(model.config.attention_backend, device, dtype, f"{source} (attention_backend in its config)")
    else:
        check_attention(attention, device, dtype, f"--attention {attention}")
        model.set_attention_backend(attention)
    return model.to(device, dtype).eval()


def compile_refusal(device) -> str | None:
    """Why torch.compile cannot compile a model for `device` here, in one line, or None: its
    compiler (inductor) builds C++ on the CPU and Triton kernels on CUDA, and nothing else here."""
    import importlib.util
    import os
    import shutil

    if device.type == "cpu":
        named = os.environ.get("CXX")
        if shutil.which(named) if named else any(shutil.which(name) for name in ("g++", "c++", "clang++")):
            return None
        found = f"CXX={named} is not a program on PATH" if named else "no g++, c++ or clang++ on PATH"
        return f"torch.compile needs a C++ compiler on the CPU ({found})"
    if device.type == "cuda":
        return None if importlib.util.find_spec("triton") else "torch.compile needs Triton on CUDA (pip install triton)"
    return f"torch.compile compiles for the CPU and CUDA here, not {device.type}"


def compile_model(model, device, source: str | None = None) -> object:
    """`model` compiled in place by torch.compile for `device` (its state dict and type unchanged;
    the compiling happens at its first calls); an InputError saying why, after `source` (the flag
    that asked) if given, where the compiler cannot run (compile_refusal)."""
    why = compile_refusal(device)
    if why is not None:
        raise InputError(why if source is None else f"{source}: {why}")
    # Static shapes first (a second shape recompiles with the changed sizes dynamic): dynamic=True from the
    # start made the README's predict (one batch shape) take three times the CPU, Inductor's cache warm.
    model.compile()
    return model
