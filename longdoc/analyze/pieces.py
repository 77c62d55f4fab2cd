"""A layer's kept attention (longdoc.model.attention.AttentionWeights) as rows of its four pieces.

The model keeps each softmax in the blocked shapes it computes it in: the long softmax [B, h, nb, b,
3b + G], whose row for long token i = n b + c (block n, place c) holds its window's keys (columns
< 3b, long tokens (n - 1) b + c') then the G global keys; the global softmax [B, h, G, G + Lp], the
global keys then the long ones. Here the rows of real queries (not padding) are taken out as [h, R,
K] with the keys each may attend to, and each row is cut into its two pieces:

  long softmax:   l2l (the window's long keys) | l2g (the global keys)
  global softmax: g2g (the global keys)        | g2l (the long keys)

The whole row of each softmax is a piece too, named after it ("long", "global").
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from longdoc.model.attention import AttentionWeights

# Each softmax's pieces, in the order of its columns; a softmax's own name stands for its whole row.
SOFTMAX_PIECES = {"long": ("l2l", "l2g"), "global": ("g2g", "g2l")}
PIECES = ("long", "l2l", "l2g", "global", "g2g", "g2l")


@dataclass
class SoftmaxRows:
    """The real queries' rows of one softmax in one layer: `weights` [h, R, K], `seen` [R, K] (the keys
    each may attend to), under residual attention the layer's `own` and `carried` scores [h, R, K]
    (None without it); the first `split` columns are its first piece, the rest its second."""

    name: str
    weights: Tensor
    seen: Tensor
    split: int
    own: Tensor | None = None
    carried: Tensor | None = None

    def pieces(self) -> dict[str, slice]:
        """The columns of each piece of this softmax, and of its whole row."""
        first, second = SOFTMAX_PIECES[self.name]
        return {self.name: slice(None), first: slice(0, self.split), second: slice(self.split, None)}


def _rows(blocked: Tensor, real: Tensor, length: int) -> Tensor:
    """[B, x, ..., K] in the blocked or plain layout of a softmax over `length` queries (padded past
    it) -> [x, R, K], the rows of the queries where `real` [B, length] is True."""
    batch, width = blocked.shape[0], blocked.shape[-1]
    flat = blocked.reshape(batch, blocked.shape[1], -1, width)[:, :, :length]  # [B, x, length, K]
    return flat.transpose(0, 1)[:, real]


def layer_rows(layer: AttentionWeights, long_mask: Tensor, global_mask: Tensor) -> list[SoftmaxRows]:
    """The rows of both softmaxes of one layer for the real tokens of `long_mask` [B, L] and
    `global_mask` [B, G] (bool); no global softmax without global tokens."""
    softmaxes = [("long", layer.long, layer.long_mask_bias, long_mask, 3 * layer.block_size)]
    if layer.global_ is not None:
        softmaxes.append(("global", layer.global_, layer.global_mask_bias, global_mask, global_mask.shape[1]))
    rows = []
    for name, weights, mask_bias, real, split in softmaxes:
        length = real.shape[1]
        seen = _rows(mask_bias == 0, real, length)[0]  # [R, K]
        own = carried = None
        if layer.summed is not None:
            summed = getattr(layer.summed, f"{name}_scores")
            received = getattr(layer.carried, f"{name}_scores")
            if received is None:  # the first layer receives nothing
                received = torch.zeros_like(summed)
            own, carried = _rows(summed - received, real, length), _rows(received, real, length)
        rows.append(SoftmaxRows(name, _rows(weights, real, length), seen, split, own, carried))
    return rows
