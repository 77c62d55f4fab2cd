"""The named records the Triton kernels take and pass between their helpers (see
longdoc.model.kernels.gpu): Triton passes a NamedTuple into a kernel and between @triton.jit
functions field by field (tensors become pointers), and a helper may build and return one (Triton
3.3 on), so the kernels read `sizes.width`, not a numbered slot. A record of tl.constexpr values
(Flags) is one too: the kernels and their helpers take their compile-time choices as one `flags`
argument, not a dozen. The launcher (softmax.py) builds those of a launch; tiles.py builds those
of a program. This module imports no Triton.
"""

from typing import Any, NamedTuple

# The fields are pointers (torch tensors on the host), ints, floats or Triton values in a kernel. In
# a compiled kernel a record is a Triton tuple, whose own attributes `values` and `type` would hide
# fields of those names: the values of a piece's keys are `key_values`.


class HeadRows(NamedTuple):
    """A [B, h, N, ...] tensor read by rows: its pointer and its batch, head and row strides."""

    data: Any
    batch_stride: Any
    head_stride: Any
    row_stride: Any


class Piece(NamedTuple):
    """A piece of keys and values [B, h, N1 | N2, d] (or of their gradients), which share strides, and
    its number of keys."""

    keys: Any
    key_values: Any
    batch_stride: Any
    head_stride: Any
    row_stride: Any
    num_keys: Any


class Operands(NamedTuple):
    """One softmax's inputs: the queries, the pieces (first, second: a tuple indexed by the PIECE
    constexpr), the relative terms [B, h, Nq, R], the ids (int32) and mask [B, Nq, N], shared by the
    heads, the carried scores [B, h, Nq, N] (contiguous; an absent one is a stand-in pointer that
    no load reads, its flag off)."""

    query: HeadRows
    pieces: tuple
    relative: HeadRows
    ids: Any
    mask: Any
    carried: Any


class Sizes(NamedTuple):
    """A softmax's sizes: with `window` b > 0 the first piece is each block's window of first_width =
    3b keys, else all of its keys; a row holds `width` pairs [first piece | second piece]."""

    num_queries: Any
    heads: Any
    head_size: Any
    window: Any
    first_width: Any
    width: Any


class Scales(NamedTuple):
    """query_scale (1 / sqrt(d)) multiplies q.k; scale (the running mean's) the summed scores."""

    query_scale: Any
    scale: Any


class Dropout(NamedTuple):
    """Dropout of the weights (tiles.dropped): Philox's seed, the drop threshold of 24 random bits
    (0: no dropout), the kept weights' scale."""

    seed: Any
    drop_threshold: Any
    keep_scale: Any


class RowStatistics(NamedTuple):
    """The online softmax's per-row max and sum of numerators, float32 [B, h, Nq]: the forward writes
    them, the backward recomputes the weights from them."""

    row_max: Any
    row_sum: Any


class Mixes(NamedTuple):
    """Talking heads' mixes (or their gradients), before and after the softmax: float32 [H, H]."""

    pre: Any
    post: Any


class Flags(NamedTuple):
    """A kernel's compile-time choices, each a tl.constexpr (Triton builds a kernel for each distinct
    record, and a helper's `if flags.DROPOUT:` is decided then): its tiles (BLOCK_M queries x
    BLOCK_N keys, D the head size padded, HEADS the heads of a talking-heads program, padded; 1
    otherwise), WINDOWED (the first piece is a window of blocks), HAS_RELATIVE, HAS_CARRIED,
    DROPOUT, PRECISION (tl.dot's for float32 operands); the forward's WRITE_SUMMED, the backward's
    SUMMED_SAVED (the summed scores read where the forward wrote them), HAS_GRAD_SUMMED and
    WRITE_GRAD_SCORES (each False in the other direction)."""

    BLOCK_M: Any
    BLOCK_N: Any
    D: Any
    HEADS: Any
    WINDOWED: Any
    HAS_RELATIVE: Any
    HAS_CARRIED: Any
    DROPOUT: Any
    PRECISION: Any
    WRITE_SUMMED: Any
    SUMMED_SAVED: Any
    HAS_GRAD_SUMMED: Any
    WRITE_GRAD_SCORES: Any


class QueryTile(NamedTuple):
    """A program's tile of queries: its first row, its rows [M] and which exist, the dims [D] of a
    head (its size padded to D) and which exist."""

    row_start: Any
    rows: Any
    row_ok: Any
    dims: Any
    dim_ok: Any


class Program(NamedTuple):
    """What a program holds: its batch entry (int64), its head (one head's; 0 for a program of all
    heads, which reads them one at a time) and which exist ([H, 1, 1] for all), its head's stream
    (batch * heads + head: dropout's counter) and its tile of queries."""

    batch: Any
    head: Any
    head_ok: Any
    stream: Any
    tile: QueryTile


class PairRows(NamedTuple):
    """Pointers to the first elements of the rows of a tile's pairs: the ids and mask (shared by the
    heads), the relative terms, the carried and summed scores (per head: those of the program's head,
    head 0 in a program of all heads), [M, 1]."""

    ids: Any
    mask: Any
    relative: Any
    carried: Any
    summed: Any


class PieceKeys(NamedTuple):
    """One batch and head of a piece, as a tile of queries reads it: pointers to its keys and values,
    their head and row strides, its number of keys, and the keys [low, high) the tile reads."""

    keys: Any
    key_values: Any
    head_stride: Any
    row_stride: Any
    num_keys: Any
    low: Any
    high: Any


class KeyTile(NamedTuple):
    """A tile of keys of a piece and its pairs with the tile of queries: the keys [N], the offsets of
    their rows [N, D] and which exist; the pairs' columns in the rows of scores ([1, N]: every query
    of a tile has the same), which are pairs of the softmax, their relative ids and their mask bias
    (float32), [M, N]."""

    index: Any
    at: Any
    key_ok: Any
    columns: Any
    valid: Any
    ids: Any
    mask_bias: Any
