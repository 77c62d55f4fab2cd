"""The choice of an attention backend: by name, from the device and the dtype (see longdoc.model.backends)."""

import torch

from longdoc.model.backends import AUTO, BACKEND_NAMES, AttentionBackendError
from longdoc.model.backends.base import AttentionBackend
from longdoc.model.backends.cpu import CpuBackend
from longdoc.model.backends.dense import DenseBackend
from longdoc.model.backends.eager import EagerBackend
from longdoc.model.backends.gpu import GpuBackend
from longdoc.model.backends.upcast import UpcastCpuBackend
from longdoc.model.kernels import cpu as cpu_kernels

BACKENDS: dict[str, type[AttentionBackend]] = {
    backend.name: backend for backend in (EagerBackend, CpuBackend, GpuBackend, DenseBackend)
}


def check_backend_name(name: str, where: str = "attention backend") -> str:
    """`name` if it names a backend (or auto), else AttentionBackendError saying which names do."""
    if name not in BACKEND_NAMES:
        raise AttentionBackendError(f"{where} {name!r} is not one of {', '.join(BACKEND_NAMES)}")
    return name


def _backend(name: str, device: torch.device, dtype: torch.dtype) -> type[AttentionBackend]:
    """The class of backend `name` (not auto) on `device` in `dtype`: on the CPU in other dtypes than
    float32, the cpu backend's is UpcastCpuBackend (it takes bfloat16 through float32 copies)."""
    if name == CpuBackend.name and device.type == "cpu" and dtype != torch.float32:
        return UpcastCpuBackend
    return BACKENDS[name]


def _auto(device: torch.device, dtype: torch.dtype) -> type[AttentionBackend]:
    # torch.compile traces the cpu kernels (torch operators) but not the GPU ones; an exported graph
    # keeps to torch's own operators (its runtimes have no others).
    if torch.compiler.is_compiling() and (torch.compiler.is_exporting() or device.type != "cpu"):
        return EagerBackend
    cpu = _backend(CpuBackend.name, device, dtype)
    if cpu_kernels.enabled() and cpu.refusal(device, dtype) is None:
        return cpu
    if device.type == "cuda" and GpuBackend.refusal(device, dtype) is None:  # (never the interpreter mode)
        return GpuBackend
    return EagerBackend


def refusal(name: str, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why backend `name` cannot run on `device` in `dtype`, in one line naming the backend, the
    device, the dtype and the backends that can; None if it can (auto always can)."""
    check_backend_name(name)
    if name == AUTO:
        return None
    reason = _backend(name, device, dtype).refusal(device, dtype)
    if reason is None:
        return None
    dtype_name = str(dtype).removeprefix("torch.")
    runs = [other for other in BACKENDS
            if other != name and _backend(other, device, dtype).refusal(device, dtype) is None]
    return (f"attention backend {name!r} cannot run on {device} in {dtype_name}: {reason}; there "
            f"{', '.join(runs)} can (or auto, which picks one)")


def resolve_backend(name: str, device: torch.device, dtype: torch.dtype) -> type[AttentionBackend]:
    """The backend that computes the attention on `device` in `dtype` for `name` (a backend, or auto);
    AttentionBackendError where it cannot run."""
    if name == AUTO:
        return _auto(device, dtype)
    why = refusal(name, device, dtype)
    if why is not None:
        raise AttentionBackendError(why)
    return _backend(name, device, dtype)
