"""Dropout whose random mask is cheap on CPU.

torch's CPU dropout draws one mt19937 number per element, in one thread (`bernoulli_`): at 4096
tokens the attention weights of one layer hold about 38 million elements, and in a training step
of the MiniLM-shaped HotpotQA model `bernoulli_` took 1.16 s of 3.84 s, more than any matmul.
Fifteen random bits per element are plenty for a keep-or-drop decision, so here every 64-bit draw
decides four elements: the mask costs a quarter of the draws and one compare.

The drop probability is rounded to a multiple of 2^-15 (0.1 -> 0.100006); kept elements are scaled
by the exact inverse of the rounded keep probability, so the expectation is unchanged. On other
devices (CUDA's Philox generator is fast) and outside training this is `torch.nn.Dropout`.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

LANE_BITS = 15
_LANE_VALUES = 1 << LANE_BITS


def keep_mask(shape: torch.Size, drop_probability: float) -> tuple[Tensor, float]:
    """A bool mask of `shape` (True: keep) and the drop probability it realises (a multiple of 2^-15).

    torch's `random_` fills int64 with 63 uniform bits; read as four int16 lanes, the low 15 bits
    of each lane are uniform and independent (the top lane's sign bit is the one that is always 0).
    """
    threshold = round(drop_probability * _LANE_VALUES)
    if threshold >= _LANE_VALUES:  # also keeps the int16 compare below in range
        return torch.zeros(shape, dtype=torch.bool), 1.0
    count = shape.numel()
    draws = torch.empty((count + 3) // 4, dtype=torch.int64).random_()
    lanes = draws.view(torch.int16)[:count].view(shape)
    return lanes.bitwise_and_(_LANE_VALUES - 1) >= threshold, threshold / _LANE_VALUES


def kept_scale(realised: float) -> float:
    """What kept elements are multiplied by, for a realised drop probability: 1 / (1 - p), 0 when all drop."""
    return 0.0 if realised >= 1.0 else 1.0 / (1.0 - realised)


def dropout(input: Tensor, drop_probability: float) -> Tensor:
    """Training's dropout of `input` (`input` itself when the probability is 0): on CPU with the cheap
    mask above, elsewhere torch's."""
    if drop_probability == 0.0:
        return input
    if input.device.type != "cpu":
        return F.dropout(input, drop_probability, training=True)
    keep, realised = keep_mask(input.shape, drop_probability)
    dropped = torch.where(keep, input, 0.0)
    scale = kept_scale(realised)
    return dropped.mul_(scale) if scale else dropped


class Dropout(nn.Dropout):
    """`torch.nn.Dropout` with the cheap mask above on CPU in training."""

    def forward(self, input: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return super().forward(input)
        return dropout(input, self.p)
