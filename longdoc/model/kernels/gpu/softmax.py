"""The launch of the Triton kernels of one softmax (forward.py, backward.py; the scheme is in
longdoc.model.kernels.gpu): its tensors as the kernels read them (`SoftmaxTensors`), their tiles,
dropout's seed, and `run_forward` and `run_backward`, which the gpu backend's autograd function
calls (longdoc.model.backends.gpu). This module imports no Triton until a kernel runs (or
`triton_failure` is asked).
"""

import functools
import importlib.util
import math
import os
from dataclasses import dataclass

import torch
from torch import Tensor

from longdoc.model.dropout import kept_scale
from longdoc.model.kernels.gpu.records import (
    Dropout, Flags, HeadRows, Mixes, Operands, Piece, RowStatistics, Scales, Sizes,
)

# Dropout's keep decisions compare 24 random bits with the drop probability times 2^24 (tiles.dropped).
DROP_BITS = 24


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


@functools.cache
def triton_failure() -> str | None:
    """Why Triton cannot be imported here (None: it can). Imports it: for the backend's choice, on
    CUDA tensors or in the interpreter mode, where a kernel is about to run."""
    if not triton_available():
        return "Triton is not installed (CUDA builds of torch ship it; else `pip install triton`, Linux x86_64)"
    try:
        importlib.import_module("triton")
    except Exception as error:  # (an install that does not import fails in many ways)
        return f"Triton cannot be imported ({type(error).__name__}: {error})"
    return None


def interpreting() -> bool:
    """Whether Triton's interpreter runs the kernels (TRITON_INTERPRET=1, set before Triton is
    imported): then they take CPU tensors, for checks without a GPU."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def interpreter_failure() -> str | None:
    """Why Triton's interpreter cannot run the kernels here (None: it can). Their loops over keys take
    their bounds from tensors, which Triton 3.6's interpreter turns into ints with int() of a
    1-element array, an error under numpy 2.4 (Triton 3.9's squeezes it first); one tiny kernel
    (tiles.loop_probe) tells."""
    import importlib.metadata

    import numpy

    from longdoc.model.kernels.gpu.tiles import loop_probe

    trips = torch.zeros(1, dtype=torch.int32)
    try:
        loop_probe[(1,)](trips, 0)
    except Exception as error:  # (the interpreter wraps what failed in its own errors)
        return (f"Triton {importlib.metadata.version('triton')}'s interpreter cannot run the kernels' loops with "
                f"numpy {numpy.__version__} ({type(error).__name__}); Triton 3.9's can")
    return None if int(trips) == 2 else f"Triton's interpreter ran a 2-trip loop {int(trips)} times"


def _kernels():
    """The forward and backward kernel modules (importing them imports triton)."""
    if not triton_available():
        raise RuntimeError("the GPU attention kernels need Triton, which is not installed: CUDA builds of torch "
                           "ship it, or `pip install triton` (Linux x86_64)")
    from longdoc.model.kernels.gpu import backward, forward

    return forward, backward


@dataclass(frozen=True)
class Tiles:
    """A kernel's tile sizes: queries (block_m) and keys (block_n) per tile, the head size padded to a
    power of two (head_dim), the heads a program holds (talking heads: all, padded; else 1), its
    warps and software-pipelining stages (None: Triton's default). Every dimension of a tl.dot is
    at least 16, in the smallest problems as in real ones."""

    block_m: int
    block_n: int
    head_dim: int
    heads: int
    num_warps: int
    num_stages: int | None = None

    def launch_options(self) -> dict:
        options = dict(num_warps=self.num_warps)
        if self.num_stages is not None:
            options["num_stages"] = self.num_stages
        return options


def tiles_for(num_queries: int, width: int, window: int, head_size: int, heads: int, talking: bool,
              dtype: torch.dtype) -> Tiles:
    """The tiles of one softmax: 32 queries (where there are 256 or more; else 16, so that a small
    softmax still makes many programs) x 64 keys (bfloat16 and float16 operands at head sizes up to
    64; 32 otherwise) where rows have 256 or more (else 16), with 8 warps where a tile has 1024
    pairs or more, else 4. With a window of blocks of `window` queries, the tiles cover a block each
    (query_tile_count), 32 or 16 of its queries, whichever leaves fewer rows past its end (32 on a
    tie): its queries share their window of keys, so that a tile reads each key of it once, no pair
    outside it, and its pairs' columns are those of its keys.

    16 is the least a tl.dot takes; the tiles are the largest whose sm_90 builds
    (tests/model/gpu_kernel_builds.py) keep every value in registers for bfloat16 and float16 at head
    sizes 32 and 64, with Triton 3.6 and 3.9: at 32 x 128 and 64 x 64 the per-pair ids, mask and
    carried scores, on top of flash attention's tiles, spill. (float32 operands, multiplied exactly
    on the CUDA cores, spill a little at 32 x 32 and head size 64, and more at 128.)

    With talking heads a program holds all heads of 16 x 16 pairs: their [h, 16, 16] scores, built a
    head at a time from [16, d] tiles of one head (the heads padded to a power of two), and the
    [h, 16, d] context in the forward, in one stage. Its sm_90 builds keep every value in registers
    too."""
    head_dim = max(16, _next_power_of_2(head_size))
    if talking:
        return Tiles(16, 16, head_dim, _next_power_of_2(heads), num_warps=8, num_stages=1)
    if window:
        block_m = min((32, 16), key=lambda rows: -(-window // rows) * rows)
    else:
        block_m = 32 if num_queries >= 256 else 16
    wide = dtype.itemsize == 2 and head_dim <= 64
    block_n = (64 if wide else 32) if width >= 256 else 16
    return Tiles(block_m, block_n, head_dim, 1, num_warps=8 if block_m * block_n >= 1024 else 4)


def query_tile_count(num_queries: int, window: int, block_m: int) -> int:
    """How many tiles of block_m queries a softmax has: with a window of blocks of `window` queries,
    each block's own (query_tile in tiles.py)."""
    if window:
        return math.ceil(num_queries / window) * math.ceil(window / block_m)
    return math.ceil(num_queries / block_m)


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@dataclass
class SoftmaxTensors:
    """One softmax's tensors as the kernels read them (see forward.py) and its sizes: q, k and v
    views where the projections wrote them (rows of d contiguous elements); the relative terms of
    every id, the ids, the mask and the carried scores by query row."""

    query: Tensor  # [B, h, Nq, d] views
    first_keys: Tensor
    first_values: Tensor
    second_keys: Tensor
    second_values: Tensor
    relative: Tensor | None  # [B, h, Nq, R]
    ids: Tensor | None  # [B, Nq, N] int32
    mask: Tensor  # [B, Nq, N]
    carried: Tensor | None  # [B, h, Nq, N]
    window: int  # b: the first piece is each block's window of 3b keys; 0: all its keys
    heads: int

    @property
    def batch(self) -> int:
        return self.query.shape[0]

    @property
    def num_queries(self) -> int:
        return self.query.shape[2]

    @property
    def head_size(self) -> int:
        return self.query.shape[3]

    @property
    def first_width(self) -> int:
        return 3 * self.window if self.window else self.first_keys.shape[2]

    @property
    def width(self) -> int:
        return self.first_width + self.second_keys.shape[2]

    @property
    def scores_shape(self) -> torch.Size:
        return torch.Size((self.batch, self.heads, self.num_queries, self.width))

    def operands(self) -> Operands:
        """The kernels' `operands` (records.Operands); the mask stands in for an absent tensor."""
        stand_in = self.mask
        return Operands(
            _head_rows(self.query),
            (_piece(self.first_keys, self.first_values), _piece(self.second_keys, self.second_values)),
            _head_rows(self.relative) if self.relative is not None else HeadRows(stand_in, 0, 0, 0),
            self.ids if self.ids is not None else stand_in, self.mask,
            self.carried if self.carried is not None else stand_in,
        )

    def sizes(self) -> Sizes:
        return Sizes(self.num_queries, self.heads, self.head_size, self.window, self.first_width, self.width)

    def scales(self, scale: float) -> Scales:
        """The kernels' `scales`: the queries' 1 / sqrt(d) and the softmax's scale."""
        return Scales(1.0 / math.sqrt(self.head_size), scale)


def _head_rows(tensor: Tensor) -> HeadRows:
    """A [B, h, N, d] tensor as the kernels read it by rows."""
    return HeadRows(tensor, *tensor.stride()[:3])


def _piece(keys: Tensor, values: Tensor) -> Piece:
    """A piece of keys and values (or of their gradients), which share strides, as the kernels take it."""
    return Piece(keys, values, *keys.stride()[:3], keys.shape[2])


@dataclass(frozen=True)
class _Dropout:
    seed: int
    threshold: int  # of DROP_BITS random bits: drop below
    keep_scale: float

    @property
    def active(self) -> bool:
        return self.threshold > 0

    def record(self) -> Dropout:
        """The kernels' `dropout` (tiles.dropped)."""
        return Dropout(self.seed, self.threshold, self.keep_scale)


def _draw_seed() -> int:
    """Philox's key for one softmax's dropout, from torch's CPU generator (torch.manual_seed fixes it;
    no device synchronisation). At least 2^31, so that Triton always passes it as int64 (a smaller
    one would compile the kernel again for an int32 argument)."""
    return int(torch.randint(1 << 31, 1 << 62, (1,)).item())


def _drop_threshold(drop_probability: float) -> int:
    """The drop probability as a count of 2^-24 (rounded): a draw of 24 bits below it drops."""
    return min(round(drop_probability * (1 << DROP_BITS)), 1 << DROP_BITS)


def dropout_for(drop_probability: float) -> _Dropout:
    """Dropout of one softmax's weights: a fresh seed, the drop probability rounded to a multiple of
    2^-24, kept weights scaled by the exact inverse of the realised keep probability."""
    threshold = _drop_threshold(drop_probability)
    if threshold == 0:
        return _Dropout(0, 0, 1.0)
    return _Dropout(_draw_seed(), threshold, kept_scale(threshold / (1 << DROP_BITS)))


def keep_mask(seed: int, drop_probability: float, shape: torch.Size, device: torch.device | str) -> Tensor:
    """The dropout mask (bool, True: kept) the kernels draw with this seed for weights of `shape`
    [B, h, Nq, N]: for checks of their dropout."""
    _kernels()
    from longdoc.model.kernels.gpu.tiles import keep_mask_kernel

    streams, elements = shape[0] * shape[1], shape[2] * shape[3]
    keep = torch.empty(streams, elements, dtype=torch.uint8, device=device)
    block = 1024
    keep_mask_kernel[(math.ceil(elements / block), streams)](keep, seed, streams, elements,
                                                             _drop_threshold(drop_probability), BLOCK=block)
    return keep.view(shape).bool()


def _precision(dtype: torch.dtype) -> str:
    """tl.dot's precision for float32 operands: exact for float32 models (as torch's matmul on
    CUDA by default); TF32 where the inputs are bfloat16/float16 (only float32 intermediates, the
    head mixes, meet it)."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _check_device(tensor: Tensor) -> None:
    if tensor.device.type != "cuda" and not interpreting():
        raise ValueError(f"the GPU attention kernels take CUDA tensors, not {tensor.device} ones "
                         "(CPU tensors run only under Triton's interpreter, TRITON_INTERPRET=1)")


def _mixes(pre: Tensor, post: Tensor, heads: int) -> Mixes:
    """The talking-heads mixes [h, h] as float32 [Hp, Hp], zero-padded to the kernel's heads."""
    padded = [torch.zeros(heads, heads, dtype=torch.float32, device=pre.device) for _ in range(2)]
    for target, mix in zip(padded, (pre, post)):
        target[: mix.shape[0], : mix.shape[1]] = mix
    return Mixes(padded[0], padded[1])


def _flags(o: SoftmaxTensors, tiles: Tiles, dropout: _Dropout, **direction: bool) -> Flags:
    """The kernels' `flags` (records.Flags) for one softmax: its tiles and operands, and `direction`'s
    flags (the forward's or the backward's; the others False), each a tl.constexpr."""
    import triton.language as tl  # (a kernel is about to run: Triton is imported by now)

    values = dict(BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, D=tiles.head_dim, HEADS=tiles.heads,
                  WINDOWED=o.window > 0, HAS_RELATIVE=o.relative is not None, HAS_CARRIED=o.carried is not None,
                  DROPOUT=dropout.active, PRECISION=_precision(o.query.dtype), WRITE_SUMMED=False, SUMMED_SAVED=False,
                  HAS_GRAD_SUMMED=False, WRITE_GRAD_SCORES=False)
    values.update(direction)
    return Flags(**{name: tl.constexpr(value) for name, value in values.items()})


def run_forward(operands: SoftmaxTensors, pre: Tensor | None, post: Tensor | None, scale: float,
                summed_out: Tensor | None, dropout: _Dropout) -> tuple[Tensor, Tensor, Tensor]:
    """One softmax's forward: (context [B, Nq, h, d], row_max, row_sum [B, h, Nq]); the summed scores
    into `summed_out` ([B, h, Nq, N], contiguous) if given."""
    o = operands
    _check_device(o.query)  # (first: the kernels' modules, imported outside the interpreter, are compiled ones)
    forward, _ = _kernels()
    talking = pre is not None
    tiles = tiles_for(o.num_queries, o.width, o.window, o.head_size, o.heads, talking, o.query.dtype)
    context = o.query.new_empty(o.batch, o.num_queries, o.heads, o.head_size)
    statistics = RowStatistics(*torch.empty(2, o.batch, o.heads, o.num_queries, dtype=torch.float32,
                                            device=o.query.device))
    summed = summed_out if summed_out is not None else o.mask
    arguments = [o.operands(), summed, _head_rows(context.transpose(1, 2)), statistics]
    flags = _flags(o, tiles, dropout, WRITE_SUMMED=summed_out is not None)
    settings = [o.sizes(), o.scales(scale), dropout.record(), flags]
    query_tiles = query_tile_count(o.num_queries, o.window, tiles.block_m)
    if talking:
        forward.talking_heads_forward[(query_tiles, o.batch)](*arguments, _mixes(pre, post, tiles.heads), *settings,
                                                              **tiles.launch_options())
    else:
        forward.attention_forward[(o.batch * o.heads, query_tiles)](*arguments, *settings, **tiles.launch_options())
    return context, statistics.row_max, statistics.row_sum


@dataclass(frozen=True)
class HeadGradients:
    """Where a backward puts the gradients of the queries, keys and values: float32 [B, h, N, d]
    views, rows contiguous, as SoftmaxTensors' (the query's written, or with talking heads added to,
    the keys' and values' added to: zeroed by the caller)."""

    query: Tensor
    first_keys: Tensor
    first_values: Tensor
    second_keys: Tensor
    second_values: Tensor


@dataclass(frozen=True)
class ScoreGradients:
    """What one softmax's backward returns besides HeadGradients: the summed scores' gradient
    [B, h, Nq, N] (where asked for) and the mixes' [h, h] (talking heads), float32 but the scores'."""

    scores: Tensor | None
    pre: Tensor | None
    post: Tensor | None


def run_backward(operands: SoftmaxTensors, gradients: HeadGradients, pre: Tensor | None, post: Tensor | None,
                 summed: Tensor | None, context: Tensor | None, row_max: Tensor, row_sum: Tensor,
                 grad_context: Tensor, grad_summed: Tensor | None, scale: float, dropout: _Dropout,
                 want_scores: bool) -> ScoreGradients:
    """One softmax's backward from the forward's statistics, into `gradients`. `summed`: the summed
    scores the forward wrote ([B, h, Nq, N]; None: computed again from the operands); `context`: the
    forward's output [B, Nq, h, d] (without talking heads: the rows' delta comes from it);
    grad_context like it."""
    _, backward = _kernels()
    o = operands
    talking = pre is not None
    tiles = tiles_for(o.num_queries, o.width, o.window, o.head_size, o.heads, talking, o.query.dtype)
    device = o.query.device
    grad_scores = torch.empty(o.scores_shape, dtype=o.query.dtype, device=device) if want_scores else None
    grad_out = grad_context.transpose(1, 2)  # [B, h, Nq, d]
    arguments = [
        o.operands(), *[o.mask if tensor is None else tensor for tensor in (summed, grad_summed, grad_scores)],
        _head_rows(grad_out),
    ]
    query_tiles = query_tile_count(o.num_queries, o.window, tiles.block_m)
    flags = _flags(o, tiles, dropout, SUMMED_SAVED=summed is not None, HAS_GRAD_SUMMED=grad_summed is not None,
                   WRITE_GRAD_SCORES=want_scores)
    grad_heads = [_head_rows(gradients.query), (_piece(gradients.first_keys, gradients.first_values),
                                                _piece(gradients.second_keys, gradients.second_values))]
    settings = [o.sizes(), o.scales(scale), dropout.record(), flags]
    grad_pre = grad_post = None
    if talking:
        # Each program's sums of the mixes' gradients, added up here (in a fixed order).
        mix_partials = torch.empty(2, o.batch * query_tiles, tiles.heads, tiles.heads, dtype=torch.float32,
                                   device=device)
        backward.talking_heads_backward[(query_tiles, o.batch)](
            *arguments, RowStatistics(row_max, row_sum), *grad_heads, _mixes(pre, post, tiles.heads),
            Mixes(*mix_partials), *settings, **tiles.launch_options())
        grad_pre, grad_post = mix_partials.sum(1)[:, : o.heads, : o.heads].unbind(0)
    else:
        # delta: each row's sum of grad_context * context (= sum of weights * their gradient).
        delta = (grad_context.float() * context.float()).sum(-1).transpose(1, 2).contiguous()  # [B, h, Nq]
        backward.attention_backward[(o.batch * o.heads, query_tiles)](
            *arguments, RowStatistics(row_max, row_sum), delta, *grad_heads, *settings, **tiles.launch_options())
    return ScoreGradients(grad_scores, grad_pre, grad_post)
