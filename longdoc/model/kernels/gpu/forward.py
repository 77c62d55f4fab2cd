"""The forward kernels of one softmax (see longdoc.model.kernels.gpu): `attention_forward` (a
program per query tile and head) and `talking_heads_forward` (a program per query tile, all heads).

Operands, as the launcher in longdoc.model.kernels.gpu.softmax passes them: q [B, h, Nq, d] and
each piece's keys and values [B, h, N1 | N2, d] at their strides (rows of d contiguous elements;
a piece's keys and values share strides); relative [B, h, Nq, R] at its strides; ids (int32) and
mask [B, Nq, N], carried and summed [B, h, Nq, N], contiguous; context [B, h, Nq, d] at its
strides; the statistics row_max, row_sum [B, h, Nq] (float32), which the backward reads.
"""

import triton
import triton.language as tl

from longdoc.model.kernels.gpu.tiles import (
    INITIAL_MAX, dropped, masked_logits, mix_heads, normalized_weights, online_softmax_step, pair_tile,
    piece_key_range, summed_scores,
)


@triton.jit
def _plain_piece(acc, row_max, row_sum, query, row_start, rows, row_ok, dims, dim_ok, keys, values, kv_stride, num_keys,
                 ids, relative_rows, carried, summed, mask, num_queries, window, column_offset, first_width, width,
                 query_scale, scale, seed, stream, drop_threshold, keep_scale, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, WINDOWED: tl.constexpr, HAS_RELATIVE: tl.constexpr,
                 HAS_CARRIED: tl.constexpr, WRITE_SUMMED: tl.constexpr, DROPOUT: tl.constexpr,
                 PRECISION: tl.constexpr):
    """The online softmax over one piece of keys, a tile of BLOCK_N keys at a time. `ids`, `carried`,
    `summed`, `mask`: pointers to the rows' first element ([M, 1])."""
    low, high = piece_key_range(row_start, num_queries, window, num_keys, BLOCK_M, WINDOWED)
    for start in range(low, high, BLOCK_N):
        key_index, key_ok, columns, valid, pair_ids, mask_bias = pair_tile(
            start, rows, row_ok, window, column_offset, first_width, num_keys, ids, mask, BLOCK_N, WINDOWED,
            HAS_RELATIVE)
        at = key_index[:, None] * kv_stride + dims[None, :]
        key_mask = key_ok[:, None] & dim_ok[None, :]
        scores = summed_scores(query, tl.load(keys + at, mask=key_mask, other=0.0), query_scale, pair_ids,
                               relative_rows, carried + columns, valid, HAS_RELATIVE, HAS_CARRIED, PRECISION)
        if WRITE_SUMMED:
            # The softmax reads the sums as stored (rounded to their dtype), as the backward and the next layer do.
            scores = scores.to(summed.dtype.element_ty).to(tl.float32)
            tl.store(summed + columns, scores.to(summed.dtype.element_ty), mask=valid)
        logits = masked_logits(scores, mask_bias, valid, scale)
        numerators, correction, row_max, row_sum = online_softmax_step(logits, row_max, row_sum)
        if DROPOUT:
            numerators = dropped(numerators, seed, stream, rows[:, None] * width + columns, drop_threshold,
                                 keep_scale)
        value_tile = tl.load(values + at, mask=key_mask, other=0.0)
        acc = acc * correction[:, None] + tl.dot(numerators.to(value_tile.dtype), value_tile,
                                                 input_precision=PRECISION)
    return acc, row_max, row_sum


@triton.jit
def attention_forward(
    q, q_batch, q_head, q_row,
    keys1, values1, kv1_batch, kv1_head, kv1_row, num_keys1,
    keys2, values2, kv2_batch, kv2_head, kv2_row, num_keys2,
    relative, relative_batch, relative_head, relative_row,
    ids, mask, carried, summed,
    context, context_batch, context_head, context_row,
    row_max_out, row_sum_out,
    num_queries, heads, head_size, window, first_width, width,
    query_scale, scale, seed, drop_threshold, keep_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, WINDOWED: tl.constexpr,
    HAS_RELATIVE: tl.constexpr, HAS_CARRIED: tl.constexpr, WRITE_SUMMED: tl.constexpr, DROPOUT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """A tile of BLOCK_M queries of one head (program ids: batch * heads + head, tile; the heads of a
    tile run next to each other, and read its rows of ids and mask from the cache) over its
    first piece of keys (window or all), then the second: summed scores (written if WRITE_SUMMED),
    online softmax, dropout, context = weights @ values; the rows' max and sum for the backward."""
    stream = tl.program_id(0)
    batch, head = stream // heads, stream % heads
    row_start = tl.program_id(1) * BLOCK_M
    rows = row_start + tl.arange(0, BLOCK_M)
    row_ok = rows < num_queries
    dims = tl.arange(0, D)
    dim_ok = dims < head_size
    batch64, head64 = batch.to(tl.int64), head.to(tl.int64)
    query = tl.load(q + batch64 * q_batch + head64 * q_head + rows[:, None] * q_row + dims[None, :],
                    mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    # Each row's first element in the [B, Nq, N] and [B, h, Nq, N] tensors.
    shared_rows = batch64 * num_queries * width + rows[:, None] * width
    own_rows = stream.to(tl.int64) * num_queries * width + rows[:, None] * width
    relative_rows = relative + batch64 * relative_batch + head64 * relative_head + rows[:, None] * relative_row

    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    row_max = tl.full((BLOCK_M,), INITIAL_MAX, dtype=tl.float32)
    row_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc, row_max, row_sum = _plain_piece(
        acc, row_max, row_sum, query, row_start, rows, row_ok, dims, dim_ok,
        keys1 + batch64 * kv1_batch + head64 * kv1_head, values1 + batch64 * kv1_batch + head64 * kv1_head,
        kv1_row, num_keys1, ids + shared_rows, relative_rows, carried + own_rows, summed + own_rows,
        mask + shared_rows, num_queries, window, 0, first_width, width, query_scale, scale, seed, stream,
        drop_threshold, keep_scale, BLOCK_M, BLOCK_N, WINDOWED, HAS_RELATIVE, HAS_CARRIED, WRITE_SUMMED, DROPOUT,
        PRECISION)
    acc, row_max, row_sum = _plain_piece(
        acc, row_max, row_sum, query, row_start, rows, row_ok, dims, dim_ok,
        keys2 + batch64 * kv2_batch + head64 * kv2_head, values2 + batch64 * kv2_batch + head64 * kv2_head,
        kv2_row, num_keys2, ids + shared_rows, relative_rows, carried + own_rows, summed + own_rows,
        mask + shared_rows, num_queries, window, first_width, first_width, width, query_scale, scale, seed, stream,
        drop_threshold, keep_scale, BLOCK_M, BLOCK_N, False, HAS_RELATIVE, HAS_CARRIED, WRITE_SUMMED, DROPOUT,
        PRECISION)

    out = acc / tl.where(row_ok, row_sum, 1.0)[:, None]  # (rows past the end: no pair, no sum)
    tl.store(context + batch64 * context_batch + head64 * context_head + rows[:, None] * context_row + dims[None, :],
             out.to(context.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])
    stats = stream.to(tl.int64) * num_queries + rows
    tl.store(row_max_out + stats, row_max, mask=row_ok)
    tl.store(row_sum_out + stats, row_sum, mask=row_ok)


@triton.jit
def _talking_piece(acc, row_max, row_sum, query_at, tile_mask, row_start, rows, row_ok, heads_ok, streams, dims, dim_ok,
                   keys, values, kv_stride, num_keys, ids, relative_rows, carried, summed, mask, pre, post,
                   num_queries, window, column_offset, first_width, width, query_scale, scale, seed,
                   drop_threshold, keep_scale, HEADS: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, WINDOWED: tl.constexpr, HAS_RELATIVE: tl.constexpr,
                   HAS_CARRIED: tl.constexpr, WRITE_SUMMED: tl.constexpr, DROPOUT: tl.constexpr,
                   STATISTICS: tl.constexpr, PRECISION: tl.constexpr):
    """One piece of keys of `talking_heads_forward`, all heads ([HEADS, M, N] tiles; `keys`, `values`,
    `relative_rows`, `carried`, `summed`: per-head pointers [HEADS, 1, 1] or [HEADS, M, 1]; `ids`,
    `mask`: [M, 1]). STATISTICS: the first pass (the mixed logits' row statistics); otherwise the
    second (the summed scores written, weights mixed by `post`, dropout, context)."""
    low, high = piece_key_range(row_start, num_queries, window, num_keys, BLOCK_M, WINDOWED)
    for start in range(low, high, BLOCK_N):
        key_index, key_ok, columns, valid, pair_ids, mask_bias = pair_tile(
            start, rows, row_ok, window, column_offset, first_width, num_keys, ids, mask, BLOCK_N, WINDOWED,
            HAS_RELATIVE)
        at = key_index[None, :, None] * kv_stride + dims[None, None, :]
        key_mask = heads_ok & key_ok[None, :, None] & dim_ok[None, None, :]
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
                weights = dropped(weights, seed, streams, (rows[:, None] * width + columns)[None, :, :],
                                  drop_threshold, keep_scale)
            value_tile = tl.load(values + at, mask=key_mask, other=0.0)
            acc += tl.dot(weights.to(value_tile.dtype), value_tile, input_precision=PRECISION)
    return acc, row_max, row_sum


@triton.jit
def talking_heads_forward(
    q, q_batch, q_head, q_row,
    keys1, values1, kv1_batch, kv1_head, kv1_row, num_keys1,
    keys2, values2, kv2_batch, kv2_head, kv2_row, num_keys2,
    relative, relative_batch, relative_head, relative_row,
    ids, mask, carried, summed,
    context, context_batch, context_head, context_row,
    row_max_out, row_sum_out,
    pre, post,
    num_queries, heads, head_size, window, first_width, width,
    query_scale, scale, seed, drop_threshold, keep_scale,
    HEADS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, WINDOWED: tl.constexpr,
    HAS_RELATIVE: tl.constexpr, HAS_CARRIED: tl.constexpr, WRITE_SUMMED: tl.constexpr, DROPOUT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """A tile of BLOCK_M queries of all heads (padded to HEADS; program ids: tile, batch), in two
    passes over the keys: the summed scores per head, mixed across heads by `pre` [HEADS, HEADS]
    (float32, zero-padded), and the statistics of the mixed logits' rows; then the summed scores
    again (written if WRITE_SUMMED), the normalised weights, mixed by `post`, dropout, context =
    weights @ values per head."""
    batch = tl.program_id(1)
    row_start = tl.program_id(0) * BLOCK_M
    rows = row_start + tl.arange(0, BLOCK_M)
    row_ok = rows < num_queries
    dims = tl.arange(0, D)
    dim_ok = dims < head_size
    head_index = tl.arange(0, HEADS)[:, None, None]
    heads_ok = head_index < heads
    batch64, head64 = batch.to(tl.int64), head_index.to(tl.int64)
    streams = batch * heads + head_index
    tile_mask = heads_ok & row_ok[None, :, None] & dim_ok[None, None, :]
    query_at = q + batch64 * q_batch + head64 * q_head + rows[None, :, None] * q_row + dims[None, None, :]
    mixing = tl.arange(0, HEADS)[:, None] * HEADS + tl.arange(0, HEADS)[None, :]
    pre_mix, post_mix = tl.load(pre + mixing), tl.load(post + mixing)
    shared_rows = batch64 * num_queries * width + rows[:, None] * width
    own_rows = (batch64 * heads + head64) * num_queries * width + rows[None, :, None] * width
    relative_rows = relative + batch64 * relative_batch + head64 * relative_head + rows[None, :, None] * relative_row
    kv1, kv2 = batch64 * kv1_batch + head64 * kv1_head, batch64 * kv2_batch + head64 * kv2_head

    acc = tl.zeros((HEADS, BLOCK_M, D), dtype=tl.float32)
    row_max = tl.full((HEADS, BLOCK_M), INITIAL_MAX, dtype=tl.float32)
    row_sum = tl.zeros((HEADS, BLOCK_M), dtype=tl.float32)
    for statistics in tl.static_range(2):
        acc, row_max, row_sum = _talking_piece(
            acc, row_max, row_sum, query_at, tile_mask, row_start, rows, row_ok, heads_ok, streams, dims, dim_ok,
            keys1 + kv1, values1 + kv1, kv1_row, num_keys1, ids + shared_rows, relative_rows, carried + own_rows,
            summed + own_rows, mask + shared_rows, pre_mix, post_mix, num_queries, window, 0, first_width, width,
            query_scale, scale, seed, drop_threshold, keep_scale, HEADS, BLOCK_M, BLOCK_N, WINDOWED, HAS_RELATIVE,
            HAS_CARRIED, WRITE_SUMMED, DROPOUT, statistics == 0, PRECISION)
        acc, row_max, row_sum = _talking_piece(
            acc, row_max, row_sum, query_at, tile_mask, row_start, rows, row_ok, heads_ok, streams, dims, dim_ok,
            keys2 + kv2, values2 + kv2, kv2_row, num_keys2, ids + shared_rows, relative_rows, carried + own_rows,
            summed + own_rows, mask + shared_rows, pre_mix, post_mix, num_queries, window, first_width, first_width,
            width, query_scale, scale, seed, drop_threshold, keep_scale, HEADS, BLOCK_M, BLOCK_N, False,
            HAS_RELATIVE, HAS_CARRIED, WRITE_SUMMED, DROPOUT, statistics == 0, PRECISION)

    tl.store(context + batch64 * context_batch + head64 * context_head + rows[None, :, None] * context_row
             + dims[None, None, :], acc.to(context.dtype.element_ty), mask=tile_mask)
    head_rows = tl.arange(0, HEADS)[:, None]
    stats = (batch64 * heads + head_rows) * num_queries + rows[None, :]
    stats_mask = (head_rows < heads) & row_ok[None, :]
    tl.store(row_max_out + stats, row_max, mask=stats_mask)
    tl.store(row_sum_out + stats, row_sum, mask=stats_mask)
