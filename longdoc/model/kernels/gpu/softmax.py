"""`TritonSoftmax`: one softmax of the global-local attention, forward and backward, on the Triton
kernels (forward.py, backward.py; the scheme is in longdoc.model.kernels.gpu). This module imports
no Triton until a kernel runs (or `triton_failure` is asked).
"""

import contextlib
import functools
import importlib.util
import math
import os
from dataclasses import dataclass

import torch
from torch import Tensor

from longdoc.model.backends.base import KernelSettings, head_views
from longdoc.model.backends.relative import relative_gradient
from longdoc.model.dropout import kept_scale

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


def tiles_for(num_queries: int, width: int, head_size: int, heads: int, talking: bool) -> Tiles:
    """The tiles of one softmax. Without talking heads: 32 queries (where there are 256 or more;
    else 16, so that a small softmax still makes many programs) x 32 keys (where rows have 256 or
    more; else 16) with 8 warps, 16 x 16 with 4.

    16 is the least a tl.dot takes; 32 x 32 tiles are the largest whose sm_90 builds
    (tests/model/gpu_kernel_builds.py) keep every value in registers for bf16 and fp16 at head
    sizes 64 and 128, with Triton 3.6 and 3.9: at 64 x 64 the per-pair ids, mask and carried
    scores, on top of flash attention's tiles, spill. (float32 operands, multiplied exactly on the
    CUDA cores, spill a little at head size 64 with Triton 3.9 and more at 128.)

    With talking heads a program holds all heads of 16 x 16 pairs (its [h, 16, 16] tiles and
    [h, 16, d] context), in one stage: pipelining the loads of its [h, 16, d] tiles in Triton's
    default three stages takes more shared memory than an H100 block has."""
    head_dim = max(16, _next_power_of_2(head_size))
    if talking:
        return Tiles(16, 16, head_dim, max(16, _next_power_of_2(heads)), num_warps=8, num_stages=1)
    block_m = 32 if num_queries >= 256 else 16
    block_n = 32 if width >= 256 else 16
    return Tiles(block_m, block_n, head_dim, 1, num_warps=8 if block_m * block_n >= 32 * 32 else 4)


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@dataclass
class _Operands:
    """One softmax's tensors as the kernels read them (see forward.py) and its sizes."""

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

    def arguments(self) -> tuple:
        """The kernels' `operands` (forward.py): the queries, both pieces' keys and values, relative
        terms, ids, mask and carried scores."""
        dummy = self.mask
        return (
            _view(self.query),
            (_piece(self.first_keys, self.first_values), _piece(self.second_keys, self.second_values)),
            _view(self.relative) if self.relative is not None else (dummy, (0, 0, 0)),
            self.ids if self.ids is not None else dummy, self.mask,
            self.carried if self.carried is not None else dummy,
        )

    def sizes(self) -> tuple:
        return (self.num_queries, self.heads, self.head_size, self.window, self.first_width, self.width)

    def scales(self, scale: float) -> tuple:
        """The kernels' `scales`: the queries' 1 / sqrt(d) and the softmax's scale."""
        return (1.0 / math.sqrt(self.head_size), scale)


def _view(tensor: Tensor) -> tuple:
    """A [B, h, N, d] tensor as the kernels take it: (pointer, its batch, head and row strides)."""
    return (tensor, tuple(tensor.stride()[:3]))


def _piece(keys: Tensor, values: Tensor) -> tuple:
    """A piece of keys and values (or their gradients), which share strides, as the kernels take it:
    (keys, values, their batch, head and row strides, the number of keys)."""
    return (keys, values, tuple(keys.stride()[:3]), keys.shape[2])


def _key_value_views(projected: Tensor, heads: int, hidden: int) -> tuple[Tensor, Tensor]:
    """Keys and values of a fused projection [B, N, 3H] or of a cross projection [B, N, 2H]."""
    return head_views(projected, heads, parts=projected.shape[-1] // hidden)[-2:]


def _rows_in_place(tensor: Tensor) -> Tensor:
    """`tensor` if its last dimension is contiguous (the kernels read rows of d elements), else a copy."""
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()


def _operands(own_qkv: Tensor, other: Tensor, relative: Tensor | None, carried: Tensor | None,
              settings: KernelSettings) -> _Operands:
    batch, num_queries, width3 = own_qkv.shape
    heads, hidden = settings.num_heads, width3 // 3
    query, first_keys, first_values = head_views(_rows_in_place(own_qkv), heads, parts=3)
    second_keys, second_values = _key_value_views(_rows_in_place(other), heads, hidden)
    relative = None if relative is None else _rows_in_place(relative)
    # Per-head tensors as [B, h, Nq, ...]; the ids and the mask, shared by the heads, as [B, Nq, N].
    rows = lambda tensor: None if tensor is None else tensor.reshape(batch, heads, num_queries, tensor.shape[-1])
    shared = lambda tensor: None if tensor is None else tensor.reshape(batch, num_queries, -1).contiguous()
    operands = _Operands(query, first_keys, first_values, second_keys, second_values, rows(relative),
                         shared(settings.kernel_ids), shared(settings.mask_bias),
                         None if carried is None else rows(carried).contiguous(), settings.window_block, heads)
    if operands.mask.shape[-1] != operands.width:
        raise ValueError(f"mask_bias has {operands.mask.shape[-1]} keys per query, the keys give {operands.width} "
                         f"(first piece {operands.first_width}, second {second_keys.shape[2]})")
    return operands


@dataclass(frozen=True)
class _Dropout:
    seed: int
    threshold: int  # of DROP_BITS random bits: drop below
    keep_scale: float

    @property
    def active(self) -> bool:
        return self.threshold > 0

    def arguments(self) -> tuple:
        """The kernels' `dropout` (tiles.dropped)."""
        return (self.seed, self.threshold, self.keep_scale)


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


def _mixes(pre: Tensor, post: Tensor, heads: int) -> tuple[Tensor, Tensor]:
    """The talking-heads mixes [h, h] as float32 [Hp, Hp], zero-padded to the kernel's heads."""
    padded = [torch.zeros(heads, heads, dtype=torch.float32, device=pre.device) for _ in range(2)]
    for target, mix in zip(padded, (pre, post)):
        target[: mix.shape[0], : mix.shape[1]] = mix
    return padded[0], padded[1]


def run_forward(operands: _Operands, pre: Tensor | None, post: Tensor | None, scale: float,
                summed_out: Tensor | None, dropout: _Dropout) -> tuple[Tensor, Tensor, Tensor]:
    """One softmax's forward: (context [B, Nq, h, d], row_max, row_sum [B, h, Nq]); the summed scores
    into `summed_out` ([B, h, Nq, N], contiguous) if given."""
    o = operands
    _check_device(o.query)  # (first: the kernels' modules, imported outside the interpreter, are compiled ones)
    forward, _ = _kernels()
    talking = pre is not None
    tiles = tiles_for(o.num_queries, o.width, o.head_size, o.heads, talking)
    context = o.query.new_empty(o.batch, o.num_queries, o.heads, o.head_size)
    statistics = torch.empty(2, o.batch, o.heads, o.num_queries, dtype=torch.float32, device=o.query.device)
    summed = summed_out if summed_out is not None else o.mask
    arguments = [o.arguments(), summed, _view(context.transpose(1, 2)), (statistics[0], statistics[1])]
    flags = dict(BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, D=tiles.head_dim, WINDOWED=o.window > 0,
                 HAS_RELATIVE=o.relative is not None, HAS_CARRIED=o.carried is not None,
                 WRITE_SUMMED=summed_out is not None, DROPOUT=dropout.active, PRECISION=_precision(o.query.dtype),
                 **tiles.launch_options())
    settings = [o.sizes(), o.scales(scale), dropout.arguments()]
    query_tiles = math.ceil(o.num_queries / tiles.block_m)
    if talking:
        forward.talking_heads_forward[(query_tiles, o.batch)](*arguments, _mixes(pre, post, tiles.heads), *settings,
                                                              HEADS=tiles.heads, **flags)
    else:
        forward.attention_forward[(o.batch * o.heads, query_tiles)](*arguments, *settings, **flags)
    return context, statistics[0], statistics[1]


@dataclass
class _Gradients:
    """What one softmax's backward returns, float32 (but grad_scores): the projections' gradients and,
    where asked for, the summed scores' and the mixes'."""

    own: Tensor  # like own_qkv [B, Nq, 3H]
    other: Tensor  # like other [B, N2, 3H or 2H]
    scores: Tensor | None  # [B, h, Nq, N]
    pre: Tensor | None
    post: Tensor | None


def run_backward(operands: _Operands, own_qkv: Tensor, other: Tensor, pre: Tensor | None, post: Tensor | None,
                 summed: Tensor | None, context: Tensor | None, row_max: Tensor, row_sum: Tensor,
                 grad_context: Tensor, grad_summed: Tensor | None, scale: float, dropout: _Dropout,
                 want_scores: bool) -> _Gradients:
    """One softmax's backward from the forward's statistics. `summed`: the summed scores the forward
    wrote ([B, h, Nq, N]; None: computed again from the operands); `context`: the forward's output
    [B, Nq, h, d] (without talking heads: the rows' delta comes from it); grad_context like it."""
    _, backward = _kernels()
    o = operands
    talking = pre is not None
    tiles = tiles_for(o.num_queries, o.width, o.head_size, o.heads, talking)
    grad_own = torch.zeros(own_qkv.shape, dtype=torch.float32, device=own_qkv.device)
    grad_other = torch.zeros(other.shape, dtype=torch.float32, device=other.device)
    grad_query, grad_first_keys, grad_first_values = head_views(grad_own, o.heads, parts=3)
    grad_second_keys, grad_second_values = _key_value_views(grad_other, o.heads, own_qkv.shape[-1] // 3)
    grad_scores = torch.empty(o.scores_shape, dtype=own_qkv.dtype, device=own_qkv.device) if want_scores else None
    grad_out = grad_context.transpose(1, 2)  # [B, h, Nq, d]
    arguments = [
        o.arguments(), *[o.mask if tensor is None else tensor for tensor in (summed, grad_summed, grad_scores)],
        _view(grad_out),
    ]
    query_tiles = math.ceil(o.num_queries / tiles.block_m)
    flags = dict(BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, D=tiles.head_dim, WINDOWED=o.window > 0,
                 HAS_RELATIVE=o.relative is not None, HAS_CARRIED=o.carried is not None,
                 SUMMED_SAVED=summed is not None, HAS_GRAD_SUMMED=grad_summed is not None,
                 WRITE_GRAD_SCORES=want_scores, DROPOUT=dropout.active,
                 PRECISION=_precision(o.query.dtype), **tiles.launch_options())
    gradients = [_view(grad_query),
                 (_piece(grad_first_keys, grad_first_values), _piece(grad_second_keys, grad_second_values))]
    settings = [o.sizes(), o.scales(scale), dropout.arguments()]
    grad_pre = grad_post = None
    if talking:
        # Each program's sums of the mixes' gradients, added up here (in a fixed order).
        mix_partials = torch.empty(2, o.batch * query_tiles, tiles.heads, tiles.heads, dtype=torch.float32,
                                   device=own_qkv.device)
        backward.talking_heads_backward[(query_tiles, o.batch)](
            *arguments, (row_max, row_sum), *gradients, _mixes(pre, post, tiles.heads),
            (mix_partials[0], mix_partials[1]), *settings, HEADS=tiles.heads, **flags)
        grad_pre, grad_post = mix_partials.sum(1)[:, : o.heads, : o.heads].unbind(0)
    else:
        # delta: each row's sum of grad_context * context (= sum of weights * their gradient).
        delta = (grad_context.float() * context.float()).sum(-1).transpose(1, 2).contiguous()  # [B, h, Nq]
        backward.attention_backward[(o.batch * o.heads, query_tiles)](*arguments, (row_max, row_sum, delta),
                                                                      *gradients, *settings, **flags)
    return _Gradients(grad_own, grad_other, grad_scores, grad_pre, grad_post)


def _device_of(tensor: Tensor):
    """Triton launches on the current CUDA device: make it the tensors' (a no-op on the CPU)."""
    return torch.cuda.device(tensor.device) if tensor.is_cuda else contextlib.nullcontext()


def _relative_gradient(grad_scores: Tensor, operands: _Operands, settings: KernelSettings,
                       relative_shape: torch.Size) -> Tensor:
    """The gradient of the relative terms [B, h, ..., Nq, R] from that of the summed scores
    [B, h, Nq, N], summed by the ids' structure (longdoc.model.backends.relative)."""
    blocked = grad_scores.view(operands.batch, operands.heads, *settings.mask_bias.shape[2:])
    return relative_gradient(blocked, settings.relative_ids, settings.links, settings.layout,
                             settings.window_block or None, relative_shape)


class TritonSoftmax(torch.autograd.Function):
    """One softmax from projections to context on the GPU kernels, called as
    `TritonSoftmax.apply(own_qkv, other, relative, carried, pre, post, settings)` (as the gpu backend,
    longdoc.model.backends.gpu, does): the queries of `own_qkv` [B, Nq, 3H] over the first keys (its
    own: with settings.window_block b > 0 the window of 3b keys around each block of b queries, else
    all) and the second keys (all of `other`'s: [B, N2, 3H] the other stream's fused projection, or
    [B, N2, 2H] a cross projection); `relative` [B, h, ..., Nq, R] the relative terms of every id,
    `carried` scores [B, h, ..., Nq, N], the talking-heads mixes `pre`, `post` [h, h] (any may be
    None). Returns (context [B, Nq, H], the summed scores [B, h, ..., Nq, N] or None).

    `settings` (longdoc.model.backends.base.KernelSettings) is read for num_heads, window_block,
    mask_bias [B, 1, ..., Nq, N], kernel_ids (the relative ids as the kernels read them, int32, like
    the mask), relative_ids, links and layout (the relative terms' gradient), scale (the running
    mean's), keep_summed (residual attention: return the summed scores), drop_probability and
    records_graph (the caller's grad mode). keep_weights and key_ranges are not read: the kernels
    keep no weights (the gpu backend computes them where asked), and score every key.
    """

    @staticmethod
    def forward(ctx, own_qkv: Tensor, other: Tensor, relative: Tensor | None, carried: Tensor | None,
                pre: Tensor | None, post: Tensor | None, settings: KernelSettings):
        if (relative is None) != (settings.kernel_ids is None):
            raise ValueError("relative terms and their ids come together: "
                             f"relative {'given' if relative is not None else 'None'}, kernel_ids "
                             f"{'given' if settings.kernel_ids is not None else 'None'}")
        operands = _operands(own_qkv, other, relative, carried, settings)
        for_backward = settings.records_graph and any(ctx.needs_input_grad[:6])
        summed = None
        if settings.keep_summed:
            # Without a backward to follow, the sums are written over the carried scores they replace.
            reuse = carried is not None and not for_backward and carried.is_contiguous()
            summed = carried if reuse else own_qkv.new_empty(
                (operands.batch, operands.heads, *settings.mask_bias.shape[2:]))
        dropout = dropout_for(settings.drop_probability)
        with _device_of(own_qkv):
            context, row_max, row_sum = run_forward(
                operands, pre, post, settings.scale, None if summed is None else summed.view(operands.scores_shape),
                dropout)
        if for_backward:
            # With residual attention the backward reads the summed scores (which the next layer
            # keeps as its carried ones) instead of computing them again from these.
            recomputed = (None, None) if summed is not None else (relative, carried)
            ctx.save_for_backward(own_qkv, other, *recomputed, pre, post, None if pre is not None else context,
                                  row_max, row_sum, summed)
            ctx.settings, ctx.dropout = settings, dropout
            ctx.relative_shape = None if relative is None else relative.shape
            ctx.carried_shape = None if carried is None else carried.shape
        batch, num_queries, width3 = own_qkv.shape
        return context.view(batch, num_queries, width3 // 3), summed

    @staticmethod
    def backward(ctx, grad_context: Tensor, grad_summed: Tensor | None):
        own_qkv, other, relative, carried, pre, post, context, row_max, row_sum, summed = ctx.saved_tensors
        settings = ctx.settings
        operands = _operands(own_qkv, other, relative, carried, settings)
        needs = ctx.needs_input_grad
        want_relative = ctx.relative_shape is not None and needs[2]
        want_carried = ctx.carried_shape is not None and needs[3]
        rows = operands.scores_shape
        with _device_of(own_qkv):
            gradients = run_backward(
                operands, own_qkv, other, pre, post, None if summed is None else summed.view(rows),
                None if context is None else context.view(*own_qkv.shape[:2], operands.heads, -1), row_max, row_sum,
                grad_context.contiguous().view(*own_qkv.shape[:2], operands.heads, -1),
                None if grad_summed is None else grad_summed.reshape(rows).contiguous(), settings.scale, ctx.dropout,
                want_relative or want_carried)
        grad_relative = grad_carried = None
        if want_relative:
            grad_relative = _relative_gradient(gradients.scores, operands, settings, ctx.relative_shape)
        if want_carried:
            grad_carried = gradients.scores.view(ctx.carried_shape)
        cast = lambda grad, like: None if grad is None else grad.to(like.dtype)
        return (cast(gradients.own, own_qkv), cast(gradients.other, other), grad_relative, grad_carried,
                cast(gradients.pre, pre), cast(gradients.post, post), None)
