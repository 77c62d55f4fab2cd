"""The backward kernels of one softmax (see longdoc.model.kernels.gpu): `attention_backward` (a
program per query tile and head) and `talking_heads_backward` (a program per query tile, all
heads). They take the forward's operands in the same order (forward.py), its statistics (row_max,
row_sum), the gradient of the context [B, h, Nq, d] at its strides, and that of the summed scores
carried on (grad_summed [B, h, Nq, N], contiguous); they write grad_scores [B, h, Nq, N] (of the
summed scores: also those of the picked relative terms and of the carried scores) and the
gradient of q at its strides, and add those of the keys and values atomically (float32 tensors
shaped like the projections).
"""

import triton
import triton.language as tl

from longdoc.model.kernels.gpu.tiles import (
    dropped, masked_logits, mix_heads, normalized_weights, pair_tile, piece_key_range, saved_or_summed_scores,
)


@triton.jit
def _plain_piece_backward(grad_query, query, grad_out, delta, row_max, row_sum, row_start, rows, row_ok, dims,
                          dim_ok, keys, values, kv_stride, grad_keys, grad_values, grad_kv_stride, num_keys, ids,
                          relative_rows, carried, summed, mask, grad_summed, grad_scores, num_queries, window,
                          column_offset, first_width, width, query_scale, scale, seed, stream, drop_threshold,
                          keep_scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WINDOWED: tl.constexpr,
                          HAS_RELATIVE: tl.constexpr, HAS_CARRIED: tl.constexpr, SUMMED_SAVED: tl.constexpr,
                          HAS_GRAD_SUMMED: tl.constexpr, WRITE_GRAD_SCORES: tl.constexpr, DROPOUT: tl.constexpr,
                          PRECISION: tl.constexpr):
    """One piece of keys of `attention_backward`: returns grad_query + this piece's part."""
    low, high = piece_key_range(row_start, num_queries, window, num_keys, BLOCK_M, WINDOWED)
    for start in range(low, high, BLOCK_N):
        key_index, key_ok, columns, valid, pair_ids, mask_bias = pair_tile(
            start, rows, row_ok, window, column_offset, first_width, num_keys, ids, mask, BLOCK_N, WINDOWED,
            HAS_RELATIVE)
        at = key_index[:, None] * kv_stride + dims[None, :]
        key_mask = key_ok[:, None] & dim_ok[None, :]
        key_tile = tl.load(keys + at, mask=key_mask, other=0.0)
        value_tile = tl.load(values + at, mask=key_mask, other=0.0)
        scores = saved_or_summed_scores(query, key_tile, query_scale, pair_ids, relative_rows, carried + columns,
                                        summed + columns, valid, HAS_RELATIVE, HAS_CARRIED, SUMMED_SAVED, PRECISION)
        logits = masked_logits(scores, mask_bias, valid, scale)
        probs = normalized_weights(logits, row_max, row_sum)
        # The gradient of the weights that multiplied the values, and those weights (after dropout).
        grad_weights = tl.dot(grad_out, tl.trans(value_tile), input_precision=PRECISION)
        weights = probs
        if DROPOUT:
            element = rows[:, None] * width + columns
            grad_weights = dropped(grad_weights, seed, stream, element, drop_threshold, keep_scale)
            weights = dropped(probs, seed, stream, element, drop_threshold, keep_scale)
        grad = scale * probs * (grad_weights - delta[:, None])
        if HAS_GRAD_SUMMED:
            grad += tl.load(grad_summed + columns, mask=valid, other=0.0).to(tl.float32)
        grad = tl.where(valid, grad, 0.0)
        if WRITE_GRAD_SCORES:
            tl.store(grad_scores + columns, grad.to(grad_scores.dtype.element_ty), mask=valid)
        grad_query += tl.dot(grad.to(key_tile.dtype), key_tile, input_precision=PRECISION)
        grad_at = key_index[:, None] * grad_kv_stride + dims[None, :]
        tl.atomic_add(grad_keys + grad_at, tl.dot(tl.trans(grad.to(query.dtype)), query, input_precision=PRECISION)
                      * query_scale, mask=key_mask, sem="relaxed")
        tl.atomic_add(grad_values + grad_at, tl.dot(tl.trans(weights.to(grad_out.dtype)), grad_out,
                                                    input_precision=PRECISION), mask=key_mask, sem="relaxed")
    return grad_query


@triton.jit
def attention_backward(
    q, q_batch, q_head, q_row,
    keys1, values1, kv1_batch, kv1_head, kv1_row, num_keys1,
    keys2, values2, kv2_batch, kv2_head, kv2_row, num_keys2,
    relative, relative_batch, relative_head, relative_row,
    ids, mask, carried, summed, grad_summed, grad_scores,
    grad_context, grad_context_batch, grad_context_head, grad_context_row,
    row_max_in, row_sum_in, delta_in,
    grad_q, grad_q_batch, grad_q_head, grad_q_row,
    grad_keys1, grad_values1, grad_kv1_batch, grad_kv1_head, grad_kv1_row,
    grad_keys2, grad_values2, grad_kv2_batch, grad_kv2_head, grad_kv2_row,
    num_queries, heads, head_size, window, first_width, width,
    query_scale, scale, seed, drop_threshold, keep_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, WINDOWED: tl.constexpr,
    HAS_RELATIVE: tl.constexpr, HAS_CARRIED: tl.constexpr, SUMMED_SAVED: tl.constexpr,
    HAS_GRAD_SUMMED: tl.constexpr, WRITE_GRAD_SCORES: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
):
    """A tile of queries of one head (program ids as attention_forward's): the weights recomputed from
    the rows' statistics, the gradient of the summed scores
    grad = scale * p * (dropout(grad_context @ v^T) - delta) + grad_summed
    (delta: the rows' sum of grad_context * context, computed by the caller), written; then
    grad_q = query_scale grad @ k (stored: the program holds the queries' every key) and, added
    atomically, grad_k += query_scale grad^T @ q, grad_v += dropout(p)^T @ grad_context."""
    stream = tl.program_id(0)
    batch, head = stream // heads, stream % heads
    row_start = tl.program_id(1) * BLOCK_M
    rows = row_start + tl.arange(0, BLOCK_M)
    row_ok = rows < num_queries
    dims = tl.arange(0, D)
    dim_ok = dims < head_size
    batch64, head64 = batch.to(tl.int64), head.to(tl.int64)
    row_dims = rows[:, None] * q_row + dims[None, :]
    tile_mask = row_ok[:, None] & dim_ok[None, :]
    query = tl.load(q + batch64 * q_batch + head64 * q_head + row_dims, mask=tile_mask, other=0.0)
    grad_out = tl.load(grad_context + batch64 * grad_context_batch + head64 * grad_context_head
                       + rows[:, None] * grad_context_row + dims[None, :], mask=tile_mask, other=0.0)
    stats = stream.to(tl.int64) * num_queries + rows
    row_max = tl.load(row_max_in + stats, mask=row_ok, other=0.0)
    row_sum = tl.load(row_sum_in + stats, mask=row_ok, other=1.0)
    delta = tl.load(delta_in + stats, mask=row_ok, other=0.0)
    shared_rows = batch64 * num_queries * width + rows[:, None] * width
    own_rows = stream.to(tl.int64) * num_queries * width + rows[:, None] * width
    relative_rows = relative + batch64 * relative_batch + head64 * relative_head + rows[:, None] * relative_row

    grad_query = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    grad_query = _plain_piece_backward(
        grad_query, query, grad_out, delta, row_max, row_sum, row_start, rows, row_ok, dims, dim_ok,
        keys1 + batch64 * kv1_batch + head64 * kv1_head, values1 + batch64 * kv1_batch + head64 * kv1_head, kv1_row,
        grad_keys1 + batch64 * grad_kv1_batch + head64 * grad_kv1_head,
        grad_values1 + batch64 * grad_kv1_batch + head64 * grad_kv1_head, grad_kv1_row, num_keys1,
        ids + shared_rows, relative_rows, carried + own_rows, summed + own_rows, mask + shared_rows,
        grad_summed + own_rows,
        grad_scores + own_rows, num_queries, window, 0, first_width, width, query_scale, scale, seed, stream,
        drop_threshold, keep_scale, BLOCK_M, BLOCK_N, WINDOWED, HAS_RELATIVE, HAS_CARRIED, SUMMED_SAVED,
        HAS_GRAD_SUMMED, WRITE_GRAD_SCORES, DROPOUT, PRECISION)
    grad_query = _plain_piece_backward(
        grad_query, query, grad_out, delta, row_max, row_sum, row_start, rows, row_ok, dims, dim_ok,
        keys2 + batch64 * kv2_batch + head64 * kv2_head, values2 + batch64 * kv2_batch + head64 * kv2_head, kv2_row,
        grad_keys2 + batch64 * grad_kv2_batch + head64 * grad_kv2_head,
        grad_values2 + batch64 * grad_kv2_batch + head64 * grad_kv2_head, grad_kv2_row, num_keys2,
        ids + shared_rows, relative_rows, carried + own_rows, summed + own_rows, mask + shared_rows,
        grad_summed + own_rows,
        grad_scores + own_rows, num_queries, window, first_width, first_width, width, query_scale, scale, seed,
        stream, drop_threshold, keep_scale, BLOCK_M, BLOCK_N, False, HAS_RELATIVE, HAS_CARRIED, SUMMED_SAVED,
        HAS_GRAD_SUMMED, WRITE_GRAD_SCORES, DROPOUT, PRECISION)
    tl.store(grad_q + batch64 * grad_q_batch + head64 * grad_q_head + rows[:, None] * grad_q_row + dims[None, :],
             (grad_query * query_scale).to(grad_q.dtype.element_ty), mask=tile_mask)


@triton.jit
def _talking_piece_backward(
    grad_query, delta, grad_pre, grad_post, query_at, grad_out_at, tile_mask, row_max, row_sum, row_start, rows,
    row_ok, heads_ok, streams, dims, dim_ok, keys, values, kv_stride, grad_keys, grad_values, grad_kv_stride,
    num_keys, ids, relative_rows, carried, summed, mask, grad_summed, grad_scores, pre, post, num_queries, window,
    column_offset, first_width, width, query_scale, scale, seed, drop_threshold, keep_scale, HEADS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WINDOWED: tl.constexpr, HAS_RELATIVE: tl.constexpr,
    HAS_CARRIED: tl.constexpr, SUMMED_SAVED: tl.constexpr, HAS_GRAD_SUMMED: tl.constexpr,
    WRITE_GRAD_SCORES: tl.constexpr, DROPOUT: tl.constexpr, DELTA: tl.constexpr, PRECISION: tl.constexpr,
):
    """One piece of keys of `talking_heads_backward` ([HEADS, M, N] tiles, pointers as in
    forward._talking_piece). DELTA: the first pass, which sums each mixed row's weights times their
    gradient (delta); otherwise the second, which returns the gradients.

    Each [HEADS, M | N, d] operand (queries at `query_at`, grad_context at `grad_out_at`, keys,
    values) is read from the cache right before the product that takes it: one such tile kept for
    a second product stays in shared memory meanwhile, and in float32 four of them at once (64 KB
    each at d = 64) would take more than a block has."""
    low, high = piece_key_range(row_start, num_queries, window, num_keys, BLOCK_M, WINDOWED)
    for start in range(low, high, BLOCK_N):
        key_index, key_ok, columns, valid, pair_ids, mask_bias = pair_tile(
            start, rows, row_ok, window, column_offset, first_width, num_keys, ids, mask, BLOCK_N, WINDOWED,
            HAS_RELATIVE)
        at = key_index[None, :, None] * kv_stride + dims[None, None, :]
        key_mask = heads_ok & key_ok[None, :, None] & dim_ok[None, None, :]
        head_valid = heads_ok & valid[None, :, :]
        scores = saved_or_summed_scores(tl.load(query_at, mask=tile_mask, other=0.0),
                                        tl.load(keys + at, mask=key_mask, other=0.0), query_scale,
                                        pair_ids[None, :, :], relative_rows, carried + columns[None, :, :],
                                        summed + columns[None, :, :], head_valid, HAS_RELATIVE, HAS_CARRIED,
                                        SUMMED_SAVED, PRECISION)
        logits = masked_logits(mix_heads(pre, scores, HEADS, BLOCK_M, BLOCK_N, PRECISION), mask_bias[None, :, :],
                               valid[None, :, :], scale)
        probs = tl.where(heads_ok, normalized_weights(logits, row_max, row_sum), 0.0)  # (no padding heads)
        # The gradients of the weights that multiplied the values (dropout's kept ones), then of the softmax's.
        grad_weights = tl.dot(tl.load(grad_out_at, mask=tile_mask, other=0.0),
                              tl.trans(tl.load(values + at, mask=key_mask, other=0.0)), input_precision=PRECISION)
        element = (rows[:, None] * width + columns)[None, :, :]
        if DROPOUT:
            grad_weights = dropped(grad_weights, seed, streams, element, drop_threshold, keep_scale)
        grad_probs = mix_heads(tl.trans(post), grad_weights, HEADS, BLOCK_M, BLOCK_N, PRECISION)
        if DELTA:
            delta += tl.sum(probs * grad_probs, -1)
        else:
            grad_logits = probs * (grad_probs - tl.expand_dims(delta, -1))
            grad = scale * mix_heads(tl.trans(pre), grad_logits, HEADS, BLOCK_M, BLOCK_N, PRECISION)
            if HAS_GRAD_SUMMED:
                grad += tl.load(grad_summed + columns[None, :, :], mask=head_valid, other=0.0).to(tl.float32)
            grad = tl.where(head_valid, grad, 0.0)
            if WRITE_GRAD_SCORES:
                tl.store(grad_scores + columns[None, :, :], grad.to(grad_scores.dtype.element_ty), mask=head_valid)
            grad_pre += scale * tl.dot(tl.reshape(grad_logits, (HEADS, BLOCK_M * BLOCK_N)),
                                       tl.trans(tl.reshape(scores, (HEADS, BLOCK_M * BLOCK_N))),
                                       input_precision=PRECISION)
            grad_post += tl.dot(tl.reshape(grad_weights, (HEADS, BLOCK_M * BLOCK_N)),
                                tl.trans(tl.reshape(probs, (HEADS, BLOCK_M * BLOCK_N))), input_precision=PRECISION)
            weights = mix_heads(post, probs, HEADS, BLOCK_M, BLOCK_N, PRECISION)
            if DROPOUT:
                weights = dropped(weights, seed, streams, element, drop_threshold, keep_scale)
            operands = keys.dtype.element_ty
            grad = grad.to(operands)
            grad_query += tl.dot(grad, tl.load(keys + at, mask=key_mask, other=0.0), input_precision=PRECISION)
            grad_at = key_index[None, :, None] * grad_kv_stride + dims[None, None, :]
            grad_keys_tile = tl.dot(tl.trans(grad), tl.load(query_at, mask=tile_mask, other=0.0),
                                    input_precision=PRECISION)
            tl.atomic_add(grad_keys + grad_at, grad_keys_tile * query_scale, mask=key_mask, sem="relaxed")
            grad_values_tile = tl.dot(tl.trans(weights.to(operands)), tl.load(grad_out_at, mask=tile_mask, other=0.0),
                                      input_precision=PRECISION)
            tl.atomic_add(grad_values + grad_at, grad_values_tile, mask=key_mask, sem="relaxed")
    return grad_query, delta, grad_pre, grad_post


@triton.jit
def talking_heads_backward(
    q, q_batch, q_head, q_row,
    keys1, values1, kv1_batch, kv1_head, kv1_row, num_keys1,
    keys2, values2, kv2_batch, kv2_head, kv2_row, num_keys2,
    relative, relative_batch, relative_head, relative_row,
    ids, mask, carried, summed, grad_summed, grad_scores,
    grad_context, grad_context_batch, grad_context_head, grad_context_row,
    row_max_in, row_sum_in,
    grad_q, grad_q_batch, grad_q_head, grad_q_row,
    grad_keys1, grad_values1, grad_kv1_batch, grad_kv1_head, grad_kv1_row,
    grad_keys2, grad_values2, grad_kv2_batch, grad_kv2_head, grad_kv2_row,
    pre, post, grad_pre_out, grad_post_out,
    num_queries, heads, head_size, window, first_width, width,
    query_scale, scale, seed, drop_threshold, keep_scale,
    HEADS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, WINDOWED: tl.constexpr,
    HAS_RELATIVE: tl.constexpr, HAS_CARRIED: tl.constexpr, SUMMED_SAVED: tl.constexpr,
    HAS_GRAD_SUMMED: tl.constexpr, WRITE_GRAD_SCORES: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
):
    """A tile of queries of all heads (program ids as talking_heads_forward's), in two passes over the
    keys. With W = post P (then dropout), P = softmax(X), X = scale pre S + mask:
    grad_W = dropout(grad_context @ v^T), grad_P = post^T grad_W, delta = rowsum(P * grad_P) (first
    pass); grad_X = P (grad_P - delta), grad_S = scale pre^T grad_X + grad_summed (written),
    grad_pre += scale grad_X S^T, grad_post += grad_W P^T over the tile's pairs (this program's sums,
    into grad_pre_out, grad_post_out [programs, HEADS, HEADS]), and q, k, v's gradients as in
    attention_backward (second pass)."""
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
    row_dims = rows[None, :, None] * q_row + dims[None, None, :]
    query_at = q + batch64 * q_batch + head64 * q_head + row_dims
    grad_out_at = (grad_context + batch64 * grad_context_batch + head64 * grad_context_head
                   + rows[None, :, None] * grad_context_row + dims[None, None, :])
    head_rows = tl.arange(0, HEADS)[:, None]
    stats = (batch64 * heads + head_rows) * num_queries + rows[None, :]
    stats_mask = (head_rows < heads) & row_ok[None, :]
    row_max = tl.load(row_max_in + stats, mask=stats_mask, other=0.0)
    row_sum = tl.load(row_sum_in + stats, mask=stats_mask, other=1.0)
    mixing = tl.arange(0, HEADS)[:, None] * HEADS + tl.arange(0, HEADS)[None, :]
    pre_mix, post_mix = tl.load(pre + mixing), tl.load(post + mixing)
    shared_rows = batch64 * num_queries * width + rows[:, None] * width
    own_rows = (batch64 * heads + head64) * num_queries * width + rows[None, :, None] * width
    relative_rows = relative + batch64 * relative_batch + head64 * relative_head + rows[None, :, None] * relative_row
    kv1, kv2 = batch64 * kv1_batch + head64 * kv1_head, batch64 * kv2_batch + head64 * kv2_head
    grad_kv1 = batch64 * grad_kv1_batch + head64 * grad_kv1_head
    grad_kv2 = batch64 * grad_kv2_batch + head64 * grad_kv2_head

    grad_query = tl.zeros((HEADS, BLOCK_M, D), dtype=tl.float32)
    delta = tl.zeros((HEADS, BLOCK_M), dtype=tl.float32)
    grad_pre = tl.zeros((HEADS, HEADS), dtype=tl.float32)
    grad_post = tl.zeros((HEADS, HEADS), dtype=tl.float32)
    for delta_pass in tl.static_range(2):
        grad_query, delta, grad_pre, grad_post = _talking_piece_backward(
            grad_query, delta, grad_pre, grad_post, query_at, grad_out_at, tile_mask, row_max, row_sum, row_start,
            rows, row_ok, heads_ok, streams, dims, dim_ok, keys1 + kv1, values1 + kv1, kv1_row, grad_keys1 + grad_kv1,
            grad_values1 + grad_kv1, grad_kv1_row, num_keys1, ids + shared_rows, relative_rows, carried + own_rows,
            summed + own_rows, mask + shared_rows, grad_summed + own_rows, grad_scores + own_rows, pre_mix, post_mix,
            num_queries, window, 0, first_width, width, query_scale, scale, seed, drop_threshold, keep_scale, HEADS,
            BLOCK_M, BLOCK_N, WINDOWED, HAS_RELATIVE, HAS_CARRIED, SUMMED_SAVED, HAS_GRAD_SUMMED, WRITE_GRAD_SCORES,
            DROPOUT, delta_pass == 0, PRECISION)
        grad_query, delta, grad_pre, grad_post = _talking_piece_backward(
            grad_query, delta, grad_pre, grad_post, query_at, grad_out_at, tile_mask, row_max, row_sum, row_start,
            rows, row_ok, heads_ok, streams, dims, dim_ok, keys2 + kv2, values2 + kv2, kv2_row, grad_keys2 + grad_kv2,
            grad_values2 + grad_kv2, grad_kv2_row, num_keys2, ids + shared_rows, relative_rows, carried + own_rows,
            summed + own_rows, mask + shared_rows, grad_summed + own_rows, grad_scores + own_rows, pre_mix, post_mix,
            num_queries, window, first_width, first_width, width, query_scale, scale, seed, drop_threshold,
            keep_scale, HEADS, BLOCK_M, BLOCK_N, False, HAS_RELATIVE, HAS_CARRIED, SUMMED_SAVED, HAS_GRAD_SUMMED,
            WRITE_GRAD_SCORES, DROPOUT, delta_pass == 0, PRECISION)

    tl.store(grad_q + batch64 * grad_q_batch + head64 * grad_q_head + rows[None, :, None] * grad_q_row
             + dims[None, None, :], (grad_query * query_scale).to(grad_q.dtype.element_ty), mask=tile_mask)
    program = (batch * tl.num_programs(0) + tl.program_id(0)).to(tl.int64) * HEADS * HEADS
    tl.store(grad_pre_out + program + mixing, grad_pre)
    tl.store(grad_post_out + program + mixing, grad_post)
