"""The cpu backend for a bfloat16 model: the float32 kernels on float32 copies of the operands.

The compiled C++ kernels (longdoc.model.backends.cpu) compute in float32. A bfloat16 model on the CPU
runs its products in bfloat16 (longdoc.model.linear) and its softmaxes here: the projections, the
mask and the relative tables are cast up as the kernels take them, and the context cast back down for
the output projection. The carried scores (residual attention) stay in float32 from layer to layer, as
the kernels write them: no cast, and the kernel may write the next layer's sum over them. Every cast is
differentiable, so a bfloat16 autocast forward and backward runs the same kernels.

On the CPU this replaces the eager backend's bfloat16 path: a little faster than it, and closer to
float32 (docs/benchmarks.md, "Precision on the CPU").
"""

import dataclasses

import torch
from torch import Tensor

from longdoc.model.backends.base import SoftmaxOperands, SoftmaxResult
from longdoc.model.backends.cpu import CpuBackend

UPCAST_DTYPES = (torch.bfloat16,)


def _float32(tensor: Tensor | None) -> Tensor | None:
    return None if tensor is None else tensor.float()


class UpcastCpuBackend(CpuBackend):
    """The cpu backend (the same name) for a model in one of UPCAST_DTYPES on the CPU."""

    @classmethod
    def refusal(cls, device: torch.device, dtype: torch.dtype) -> str | None:
        if device.type != "cpu" or dtype not in UPCAST_DTYPES:
            return "the C++ kernels run on the CPU in float32, and in bfloat16 on float32 copies"
        return super().refusal(device, torch.float32)

    def __init__(self, reuse_buffers: bool = False, keep_weights: bool = False):
        super().__init__(reuse_buffers, keep_weights)
        # The last softmax's projections and their copies: a layer's second softmax reads the same two.
        self._copies: tuple[tuple[Tensor, Tensor], ...] = ()

    def _copy(self, projection: Tensor) -> Tensor:
        copy = next((copy for source, copy in self._copies if source is projection), None)
        return projection.float() if copy is None else copy

    def attend(self, operands: SoftmaxOperands) -> SoftmaxResult:
        own, other = self._copy(operands.own), self._copy(operands.other)
        self._copies = ((operands.own, own), (operands.other, other))
        # The mask is the same tensor in every layer: cast once per forward pass.
        mask_bias = self.derived(operands.mask_bias, "float32", lambda mask: mask.float())
        result = super().attend(dataclasses.replace(
            operands, own=own, other=other, mask_bias=mask_bias,
            relative_key=_float32(operands.relative_key), relative_bias=_float32(operands.relative_bias),
            carried=_float32(operands.carried), talking_heads_pre=_float32(operands.talking_heads_pre),
            talking_heads_post=_float32(operands.talking_heads_post),
        ))
        return SoftmaxResult(result.context.to(operands.own.dtype), result.summed, result.weights)
