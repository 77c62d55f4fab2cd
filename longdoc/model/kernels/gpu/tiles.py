"""Triton building blocks of the GPU attention's forward and backward kernels (see
longdoc.model.kernels.gpu): which pairs a tile of queries and keys holds, the summed scores of a
tile, the online softmax's step and dropout's keep decision.

They work on tiles of any rank: [M, N] (one head's queries and keys) or [h, M, N] (all heads of
the queries, talking heads), reducing over the last axis. Imported only when a kernel runs (it
imports triton).
"""

import triton
import triton.language as tl

from longdoc.model.kernels.gpu.records import Dropout, KeyTile, PairRows, PieceKeys, Program, QueryTile

LOG2E = tl.constexpr(1.4426950408889634)
# The softmax's logits are kept in base 2 (log2(e) folded into the scale and the mask: exp2 of their
# differences are the weights' numerators), and the rows' statistics with them. A row's running
# maximum starts below every logit a row can have (a masked one is about -2.5e38: half float32's
# or bfloat16's minimum times log2(e), plus a score), so that a tile holding none of the row's
# pairs (their logits are -inf) leaves it as it is and adds exp2(-inf) = 0; and far enough from
# float32's limit (3.4e38) that logit - maximum stays finite.
INITIAL_MAX = tl.constexpr(-3.0e38)


@triton.jit
def loop_probe(out, low):
    """Counts the trips of a loop whose bounds are tensors, as every kernel's loop over keys has
    (softmax.interpreter_failure runs it in Triton's interpreter)."""
    trips = 0
    for _ in range(low, low + 2, 1):
        trips += 1
    tl.store(out, trips)


@triton.jit
def query_tile(tile, sizes, flags):
    """Tile `tile` of BLOCK_M queries (QueryTile). Windowed, the tiles of a block of `window` queries
    start at the block's first query and cover it (the last one's rows past it do not exist), so
    that every query of a tile has the same window of keys; otherwise tile t holds queries
    t BLOCK_M .. (t + 1) BLOCK_M - 1."""
    offsets = tl.arange(0, flags.BLOCK_M)  # [M]
    if flags.WINDOWED:
        tiles_per_block = tl.cdiv(sizes.window, flags.BLOCK_M)
        within = (tile % tiles_per_block) * flags.BLOCK_M
        row_start = (tile // tiles_per_block) * sizes.window + within
        row_ok = (within + offsets < sizes.window) & (row_start + offsets < sizes.num_queries)
    else:
        row_start = tile * flags.BLOCK_M
        row_ok = row_start + offsets < sizes.num_queries
    dims = tl.arange(0, flags.D)  # [D]
    return QueryTile(row_start, row_start + offsets, row_ok, dims, dims < sizes.head_size)


@triton.jit
def head_rows(view, batch, head, rows):
    """Pointers to the first elements of `rows` of one batch and head in a [B, h, Nq, ...] tensor
    (`view`: records.HeadRows); batch, head and rows of shapes that broadcast ([M, 1] for one head,
    [h, 1, 1] and [1, M, 1] for all of them)."""
    return view.data + batch * view.batch_stride + head * view.head_stride + rows * view.row_stride


@triton.jit
def piece_heads(piece, batch, head):
    """One batch and head of a piece of keys and values, or of their gradients (records.Piece):
    (pointers to its keys, to its values)."""
    offset = batch * piece.batch_stride + head * piece.head_stride
    return piece.keys + offset, piece.key_values + offset


@triton.jit
def score_rows(stream, rows, num_queries, width):
    """Offsets of the first elements of `rows` in contiguous [streams, Nq, N] rows of N pairs: the
    ids and the mask (a stream per batch: the heads share them), the scores and their gradients (a
    stream per batch and head)."""
    return (stream * num_queries + rows) * width


@triton.jit
def key_rows(keys, key_ok, row_stride, dims, dim_ok):
    """The offsets [N, D] of the rows of `keys` [N] (keys, values or their gradients, rows
    `row_stride` apart) and which exist."""
    return keys[:, None] * row_stride + dims[None, :], key_ok[:, None] & dim_ok[None, :]


@triton.jit
def _pair_rows(operands, summed, batch, head, rows, own_rows, num_queries, width):
    """The rows of a tile's pairs (records.PairRows); `own_rows`: their offsets in per-head scores."""
    shared_rows = score_rows(batch, rows[:, None], num_queries, width)  # [M, 1]
    return PairRows(operands.ids + shared_rows, operands.mask + shared_rows,
                    head_rows(operands.relative, batch, head, rows[:, None]), operands.carried + own_rows,
                    summed + own_rows)


@triton.jit
def one_head_program(operands, summed, sizes, flags):
    """A program of one head's tile of queries (program ids: batch * heads + head, tile): its
    records.Program (one head, which exists), the mask of its [M, D] tiles, the rows of its pairs
    (records.PairRows) and the offsets of its rows in per-head scores ([M, 1])."""
    stream = tl.program_id(0)
    batch, head = (stream // sizes.heads).to(tl.int64), (stream % sizes.heads).to(tl.int64)
    tile = query_tile(tl.program_id(1), sizes, flags)
    own_rows = score_rows(stream.to(tl.int64), tile.rows[:, None], sizes.num_queries, sizes.width)  # [M, 1]
    pairs = _pair_rows(operands, summed, batch, head, tile.rows, own_rows, sizes.num_queries, sizes.width)
    return (Program(batch, head, True, stream, tile), tile.row_ok[:, None] & tile.dim_ok[None, :], pairs,
            own_rows)


@triton.jit
def all_heads_program(operands, summed, sizes, flags):
    """A program of all heads of a tile of queries (talking heads; program ids: tile, batch), the
    heads padded to HEADS, which reads them a head at a time: its records.Program (head 0, which
    head_offset moves to another; which heads exist, [HEADS, 1, 1]; head 0's stream), the mask of
    its [M, D] tiles, the rows of head 0's pairs (records.PairRows) and their offsets in per-head
    scores ([M, 1])."""
    batch = tl.program_id(1).to(tl.int64)
    tile = query_tile(tl.program_id(0), sizes, flags)
    own_rows = score_rows(batch * sizes.heads, tile.rows[:, None], sizes.num_queries, sizes.width)  # [M, 1]
    pairs = _pair_rows(operands, summed, batch, 0, tile.rows, own_rows, sizes.num_queries, sizes.width)
    program = Program(batch, 0, tl.arange(0, flags.HEADS)[:, None, None] < sizes.heads, tl.program_id(1) * sizes.heads,
                      tile)
    return program, tile.row_ok[:, None] & tile.dim_ok[None, :], pairs, own_rows


@triton.jit
def head_score_offset(head, sizes):
    """How far head `head`'s rows of per-head scores (contiguous [B, h, Nq, N]) are from head 0's."""
    return tl.cast(head, tl.int64) * sizes.num_queries * sizes.width


@triton.jit
def head_tile(view, program, head):
    """Pointers [M, D] to head `head`'s rows of the program's tile of queries in a [B, h, Nq, d]
    tensor (records.HeadRows: the queries, the context or their gradients)."""
    tile = program.tile
    return head_rows(view, program.batch, head, tile.rows[:, None]) + tile.dims[None, :]


@triton.jit
def head_scores(head, program, tile_mask, operands, piece, keys, pairs, sizes, scales, flags):
    """Head `head`'s summed scores [M, N] of a tile of all_heads_program's (`pairs`: head 0's rows;
    `piece`: records.PieceKeys, `keys`: records.KeyTile)."""
    query = tl.load(head_tile(operands.query, program, head), mask=tile_mask, other=0.0)  # [M, D]
    key_tile = tl.load(piece.keys + head * piece.head_stride + keys.at, mask=keys.key_ok, other=0.0)  # [N, D]
    return summed_scores(query, key_tile, scales.query_scale, keys.ids, pairs.relative + head *
                         operands.relative.head_stride, pairs.carried + head_score_offset(head, sizes) + keys.columns,
                         keys.valid, flags)


@triton.jit
def head_statistics(batch, sizes, tile, flags):
    """The offsets [HEADS, M] of all heads' rows of a tile in the [B, h, Nq] statistics, and which
    exist."""
    head_index = tl.arange(0, flags.HEADS)[:, None]  # [HEADS, 1]
    return ((batch * sizes.heads + head_index) * sizes.num_queries + tile.rows[None, :],
            (head_index < sizes.heads) & tile.row_ok[None, :])


@triton.jit
def piece_of(pieces, program, sizes, PIECE: tl.constexpr, flags):
    """Piece PIECE of the keys (0: the queries' own, in a window if WINDOWED; 1: the other
    stream's) as the program's tile of queries reads it (records.PieceKeys). With a window of
    blocks of `window` queries, the tile's block i reads keys (i - 1) b .. (i + 2) b - 1 (beyond
    [0, num_keys) is the window's zero padding); otherwise all."""
    piece = pieces[PIECE]
    keys, values = piece_heads(piece, program.batch, program.head)
    if flags.WINDOWED and PIECE == 0:
        low = (program.tile.row_start // sizes.window - 1) * sizes.window
        high = low + sizes.first_width
    else:
        low = 0
        high = piece.num_keys
    return PieceKeys(keys, values, piece.head_stride, piece.row_stride, piece.num_keys, low, high)


@triton.jit
def pair_tile(start, tile, sizes, piece, pairs, PIECE: tl.constexpr, flags):
    """The tile of BLOCK_N keys of piece PIECE (records.PieceKeys) from `start` and its pairs with
    the tile of queries (records.KeyTile; their relative ids are the columns without HAS_RELATIVE),
    read from the rows of `pairs` (records.PairRows). Windowed, the queries of block i have columns
    0..3b-1 for keys (i - 1) b .. (i + 2) b - 1 (those outside [0, num_keys) are the zero padding);
    otherwise key j of the first piece has column j, of the second first_width + j."""
    keys = start + tl.arange(0, flags.BLOCK_N)  # [N]
    key_ok = (keys >= 0) & (keys < piece.num_keys)
    if flags.WINDOWED and PIECE == 0:
        # (the tile's queries share one window: piece.low is its first key, column 0)
        columns = keys - piece.low
        valid = (columns < sizes.first_width)[None, :] & tile.row_ok[:, None]  # [M, N]
    else:
        columns = PIECE * sizes.first_width + keys
        valid = key_ok[None, :] & tile.row_ok[:, None]
    columns = columns[None, :]  # [1, N]: the same for every row of the tile
    pair_ids = columns
    if flags.HAS_RELATIVE:
        pair_ids = tl.load(pairs.ids + columns, mask=valid, other=0)
    mask_bias = tl.load(pairs.mask + columns, mask=valid, other=0.0).to(tl.float32)
    at, key_mask = key_rows(keys, key_ok, piece.row_stride, tile.dims, tile.dim_ok)  # [N, D]
    return KeyTile(keys, at, key_mask, columns, valid, pair_ids, mask_bias)


@triton.jit
def summed_scores(query, keys, query_scale, ids, relative_rows, carried_at, valid, flags):
    """query_scale q.k + relative[ids] + carried, in float32 ([.., M, D] x [.., N, D] -> [.., M, N]).
    `ids` [M, N] (loaded: the heads share them), `relative_rows` pointers to each row's relative
    terms ([.., M, 1]), `carried_at` pointers to the carried scores of the pairs."""
    summed = tl.dot(query, tl.trans(keys), input_precision=flags.PRECISION) * query_scale
    if flags.HAS_RELATIVE:
        summed += tl.load(relative_rows + ids, mask=valid, other=0.0).to(tl.float32)
    if flags.HAS_CARRIED:
        summed += tl.load(carried_at, mask=valid, other=0.0).to(tl.float32)
    return summed


@triton.jit
def saved_or_summed_scores(query, keys, query_scale, ids, relative_rows, carried_at, summed_at, valid, flags):
    """The backward's summed scores of a tile: read at `summed_at` where the forward wrote them
    (SUMMED_SAVED: residual attention), else computed again (summed_scores)."""
    if flags.SUMMED_SAVED:
        scores = tl.load(summed_at, mask=valid, other=0.0).to(tl.float32)
    else:
        scores = summed_scores(query, keys, query_scale, ids, relative_rows, carried_at, valid, flags)
    return scores


@triton.jit
def masked_logits(scores, mask_bias, valid, scale):
    """The softmax's input scale * scores + mask_bias in base 2 (times log2(e)), -inf outside the
    rows' pairs (no weight)."""
    return tl.where(valid, (scale * LOG2E) * scores + LOG2E * mask_bias, float("-inf"))


@triton.jit
def online_softmax_step(logits, row_max, row_sum):
    """One tile of the online softmax over the last axis (logits in base 2): (its numerators
    exp2(logits - new max), the correction exp2(old max - new max) of what was accumulated, the new
    max, the new sum)."""
    new_max = tl.maximum(row_max, tl.max(logits, -1))
    correction = tl.exp2(row_max - new_max)
    numerators = tl.exp2(logits - tl.expand_dims(new_max, -1))
    return numerators, correction, new_max, row_sum * correction + tl.sum(numerators, -1)


@triton.jit
def normalized_weights(logits, row_max, row_sum):
    """The softmax's weights of a tile from the statistics of its rows (max, sum of numerators; a sum
    of 0 is a row past the queries' end, without pairs)."""
    numerators = tl.exp2(logits - tl.expand_dims(row_max, -1))
    return numerators / tl.expand_dims(tl.where(row_sum > 0, row_sum, 1.0), -1)


@triton.jit
def dropped(values, dropout, stream, element):
    """Dropout of `values`: kept ones times keep_scale, the others 0 (`dropout`: records.Dropout). The
    decision for an element of the weights is Philox (seed; counters: `element`, its place in its
    head's [Nq, N] rows, and `stream`, batch * heads + head): 24 uniform bits, kept when at least
    drop_threshold (the drop probability times 2^24), so the forward and the backward draw the same
    mask without storing it."""
    bits, _, _, _ = tl.philox(dropout.seed, element, stream, 0, 0)
    kept = (bits >> 8).to(tl.int32) >= dropout.drop_threshold
    return tl.where(kept, values * dropout.keep_scale, 0.0)


@triton.jit
def keep_mask_kernel(keep, seed, num_streams, elements, drop_threshold, BLOCK: tl.constexpr):
    """keep [streams, elements] (uint8): 1 where `dropped` keeps the element (for checks)."""
    stream = tl.program_id(1)
    element = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    kept = dropped(tl.full((BLOCK,), 1.0, tl.float32), Dropout(seed, drop_threshold, 1.0), stream, element)
    tl.store(keep + stream.to(tl.int64) * elements + element, kept.to(tl.uint8), mask=element < elements)
