"""The forward kernels of one softmax (see longdoc.model.kernels.gpu): `attention_forward` (a
program per query tile and head) and `talking_heads_forward` (a program per query tile, all heads).

Operands, as the launcher in longdoc.model.kernels.gpu.softmax passes them (tuples; a "view" is a
pointer and its (batch, head, row) strides): `operands` = (q [B, h, Nq, d] as a view, the pieces
(each: keys, values [B, h, N1 | N2, d], their strides (rows of d contiguous elements; a piece's
keys and values share strides), its number of keys), relative [B, h, Nq, R] as a view, ids (int32)
and mask [B, Nq, N], carried [B, h, Nq, N], contiguous); summed [B, h, Nq, N], contiguous; context
[B, h, Nq, d] as a view; `statistics` (row_max, row_sum [B, h, Nq], float32, which the backward
reads); `sizes` (num_queries, heads, head_size, window, first_width, width); `scales` (query_scale,
scale); `dropout` (seed, drop_threshold, keep_scale).
"""

import triton
import triton.language as tl

from longdoc.model.kernels.gpu.tiles import (
    INITIAL_MAX, all_heads_program, dropped, head_mixes, head_rows, head_statistics, masked_logits, mix_heads,
    normalized_weights, one_head_program, online_softmax_step, pair_tile, piece_of, summed_scores,
)


@triton.jit
def _plain_piece(acc, row_max, row_sum, query, tile, pieces, batch, head, stream, pairs, sizes, scales, dropout,
                 PIECE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WINDOWED: tl.constexpr,
                 HAS_RELATIVE: tl.constexpr, HAS_CARRIED: tl.constexpr, WRITE_SUMMED: tl.constexpr,
                 DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    """The online softmax over piece PIECE of the keys (0: the first, windowed if WINDOWED; 1: the
    second), a tile of BLOCK_N keys at a time. `tile`: query_tile's; `pairs`: pointers to the rows'
    first elements ([M, 1]) of the ids, mask, relative terms, carried and summed scores."""
    rows, width = tile[1], sizes[5]
    ids, mask, relative_rows, carried, summed = pairs
    query_scale, scale = scales
    keys, values, kv_row, num_keys, low, high = piece_of(pieces, batch, head, tile, sizes, PIECE, BLOCK_M, WINDOWED)
    for start in range(low, high, BLOCK_N):
        key_index, at, key_mask, columns, valid, pair_ids, mask_bias = pair_tile(
            start, tile, sizes, num_keys, kv_row, ids, mask, PIECE, BLOCK_N, WINDOWED, HAS_RELATIVE)
        scores = summed_scores(query, tl.load(keys + at, mask=key_mask, other=0.0), query_scale, pair_ids,
                               relative_rows, carried + columns, valid, HAS_RELATIVE, HAS_CARRIED, PRECISION)
        if WRITE_SUMMED:
            # The softmax reads the sums as stored (rounded to their dtype), as the backward and the next layer do.
            scores = scores.to(summed.dtype.element_ty).to(tl.float32)
            tl.store(summed + columns, scores.to(summed.dtype.element_ty), mask=valid)
        logits = masked_logits(scores, mask_bias, valid, scale)
        numerators, correction, row_max, row_sum = online_softmax_step(logits, row_max, row_sum)
        if DROPOUT:
            numerators = dropped(numerators, dropout, stream, rows[:, None] * width + columns)
        value_tile = tl.load(values + at, mask=key_mask, other=0.0)
        acc = acc * correction[:, None] + tl.dot(numerators.to(value_tile.dtype), value_tile,
                                                 input_precision=PRECISION)
    return acc, row_max, row_sum


@triton.jit
def attention_forward(operands, summed, context, statistics, sizes, scales, dropout,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, WINDOWED: tl.constexpr,
                      HAS_RELATIVE: tl.constexpr, HAS_CARRIED: tl.constexpr, WRITE_SUMMED: tl.constexpr,
                      DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    """A tile of BLOCK_M queries of one head (program ids: batch * heads + head, tile; the heads of a
    tile run next to each other, and read its rows of ids and mask from the cache) over its
    first piece of keys (window or all), then the second: summed scores (written if WRITE_SUMMED),
    online softmax, dropout, context = weights @ values; the rows' max and sum for the backward."""
    stream, batch, head, tile, tile_mask, pairs, _ = one_head_program(operands, summed, sizes, BLOCK_M, D)
    rows, row_ok, dims = tile[1], tile[2], tile[3]
    query = tl.load(head_rows(operands[0], batch, head, rows[:, None]) + dims[None, :], mask=tile_mask, other=0.0)

    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    row_max = tl.full((BLOCK_M,), INITIAL_MAX, dtype=tl.float32)
    row_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for piece in tl.static_range(2):
        acc, row_max, row_sum = _plain_piece(
            acc, row_max, row_sum, query, tile, operands[1], batch, head, stream, pairs, sizes, scales, dropout, piece,
            BLOCK_M, BLOCK_N, WINDOWED, HAS_RELATIVE, HAS_CARRIED, WRITE_SUMMED, DROPOUT, PRECISION)

    out = acc / tl.where(row_ok, row_sum, 1.0)[:, None]  # (rows past the end: no pair, no sum)
    tl.store(head_rows(context, batch, head, rows[:, None]) + dims[None, :], out.to(context[0].dtype.element_ty),
             mask=tile_mask)
    stats = stream.to(tl.int64) * sizes[0] + rows
    tl.store(statistics[0] + stats, row_max, mask=row_ok)
    tl.store(statistics[1] + stats, row_sum, mask=row_ok)


@triton.jit
def _talking_piece(acc, row_max, row_sum, query_at, tile_mask, tile, pieces, batch, heads, pairs, mixes, sizes,
                   scales, dropout, PIECE: tl.constexpr, HEADS: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, WINDOWED: tl.constexpr, HAS_RELATIVE: tl.constexpr,
                   HAS_CARRIED: tl.constexpr, WRITE_SUMMED: tl.constexpr, DROPOUT: tl.constexpr,
                   STATISTICS: tl.constexpr, PRECISION: tl.constexpr):
    """Piece PIECE of the keys of `talking_heads_forward`, all heads ([HEADS, M, N] tiles; `heads`:
    all_heads_program's; `pairs` as in _plain_piece, the relative terms, carried and summed scores per head
    ([HEADS, M, 1]); `mixes`: pre, post [HEADS, HEADS]). STATISTICS: the first pass (the mixed
    logits' row statistics); otherwise the second (the summed scores written, weights mixed by
    `post`, dropout, context)."""
    rows, width = tile[1], sizes[5]
    head, heads_ok, streams = heads
    ids, mask, relative_rows, carried, summed = pairs
    query_scale, scale = scales
    pre, post = mixes
    keys, values, kv_row, num_keys, low, high = piece_of(pieces, batch, head, tile, sizes, PIECE, BLOCK_M, WINDOWED)
    for start in range(low, high, BLOCK_N):
        key_index, at, key_mask, columns, valid, pair_ids, mask_bias = pair_tile(
            start, tile, sizes, num_keys, kv_row, ids, mask, PIECE, BLOCK_N, WINDOWED, HAS_RELATIVE)
        key_mask = heads_ok & key_mask
        head_valid = heads_ok & valid[None, :, :]
        # (the queries read in each step, from the cache, as in backward._talking_piece_backward)
        scores = summed_scores(tl.load(query_at, mask=tile_mask, other=0.0),
                               tl.load(keys + at, mask=key_mask, other=0.0), query_scale, pair_ids[None, :, :],
                               relative_rows, carried + columns[None, :, :], head_valid, HAS_RELATIVE, HAS_CARRIED,
                               PRECISION)
        if WRITE_SUMMED:
            # As stored (rounded to their dtype), in both passes: what the backward and the next layer read.
            scores = scores.to(summed.dtype.element_ty).to(tl.float32)
        logits = masked_logits(mix_heads(pre, scores, HEADS, BLOCK_M, BLOCK_N, PRECISION), mask_bias[None, :, :],
                               valid[None, :, :], scale)
        if STATISTICS:
            _, _, row_max, row_sum = online_softmax_step(logits, row_max, row_sum)
        else:
            # (written in the second pass: the sums may go over the carried scores, which both passes read)
            if WRITE_SUMMED:
                tl.store(summed + columns[None, :, :], scores.to(summed.dtype.element_ty), mask=head_valid)
            weights = mix_heads(post, normalized_weights(logits, row_max, row_sum), HEADS, BLOCK_M, BLOCK_N,
                                PRECISION)
            if DROPOUT:
                weights = dropped(weights, dropout, streams, (rows[:, None] * width + columns)[None, :, :])
            value_tile = tl.load(values + at, mask=key_mask, other=0.0)
            acc += tl.dot(weights.to(value_tile.dtype), value_tile, input_precision=PRECISION)
    return acc, row_max, row_sum


@triton.jit
def talking_heads_forward(operands, summed, context, statistics, mixes, sizes, scales, dropout,
                          HEADS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                          WINDOWED: tl.constexpr, HAS_RELATIVE: tl.constexpr, HAS_CARRIED: tl.constexpr,
                          WRITE_SUMMED: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    """A tile of BLOCK_M queries of all heads (padded to HEADS; program ids: tile, batch), in two
    passes over the keys: the summed scores per head, mixed across heads by `pre` [HEADS, HEADS]
    (float32, zero-padded), and the statistics of the mixed logits' rows; then the summed scores
    again (written if WRITE_SUMMED), the normalised weights, mixed by `post`, dropout, context =
    weights @ values per head."""
    batch, heads, tile, tile_mask, pairs, _ = all_heads_program(operands, summed, sizes, HEADS, BLOCK_M, D)
    head, rows, dims = heads[0], tile[1], tile[3]
    query_at = head_rows(operands[0], batch, head, rows[:, None]) + dims[None, :]
    _, pre_mix, post_mix = head_mixes(mixes, HEADS)

    acc = tl.zeros((HEADS, BLOCK_M, D), dtype=tl.float32)
    row_max = tl.full((HEADS, BLOCK_M), INITIAL_MAX, dtype=tl.float32)
    row_sum = tl.zeros((HEADS, BLOCK_M), dtype=tl.float32)
    for statistics_pass in tl.static_range(2):
        for piece in tl.static_range(2):
            acc, row_max, row_sum = _talking_piece(
                acc, row_max, row_sum, query_at, tile_mask, tile, operands[1], batch, heads, pairs, (pre_mix, post_mix),
                sizes, scales, dropout, piece, HEADS, BLOCK_M, BLOCK_N, WINDOWED, HAS_RELATIVE, HAS_CARRIED,
                WRITE_SUMMED, DROPOUT, statistics_pass == 0, PRECISION)

    tl.store(head_rows(context, batch, head, rows[:, None]) + dims[None, :], acc.to(context[0].dtype.element_ty),
             mask=tile_mask)
    stats, stats_mask = head_statistics(batch, sizes, tile, HEADS)
    tl.store(statistics[0] + stats, row_max, mask=stats_mask)
    tl.store(statistics[1] + stats, row_sum, mask=stats_mask)
