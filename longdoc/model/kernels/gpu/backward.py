"""The backward kernels of one softmax (see longdoc.model.kernels.gpu): `attention_backward` (a
program per query tile and head) and `talking_heads_backward` (a program per query tile, all
heads). They take the forward's `operands` and summed scores (forward.py), the gradient of the summed
scores carried on (grad_summed [B, h, Nq, N], contiguous), the gradient of the context [B, h, Nq,
d] as a view, the forward's statistics (row_max, row_sum; and without talking heads each row's
delta); they write grad_scores [B, h, Nq, N] (of the summed scores: also those of the picked
relative terms and of the carried scores) and the gradient of q (a view), and add those of the
keys and values atomically (`grad_pieces`, as the forward's pieces: float32 tensors shaped like
the projections).
"""

import triton
import triton.language as tl

from longdoc.model.kernels.gpu.tiles import (
    all_heads_program, dropped, head_mixes, head_rows, head_statistics, masked_logits, mix_heads, normalized_weights,
    one_head_program, pair_tile, piece_heads, piece_of, saved_or_summed_scores,
)


@triton.jit
def _plain_piece_backward(grad_query, query, grad_out, delta, row_max, row_sum, tile, pieces, grad_pieces, batch,
                          head, stream, pairs, grad_pairs, sizes, scales, dropout, PIECE: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WINDOWED: tl.constexpr,
                          HAS_RELATIVE: tl.constexpr, HAS_CARRIED: tl.constexpr, SUMMED_SAVED: tl.constexpr,
                          HAS_GRAD_SUMMED: tl.constexpr, WRITE_GRAD_SCORES: tl.constexpr, DROPOUT: tl.constexpr,
                          PRECISION: tl.constexpr):
    """Piece PIECE of the keys of `attention_backward` (arguments as forward._plain_piece's;
    `grad_pairs`: pointers to the rows of grad_summed and grad_scores): returns grad_query + this
    piece's part."""
    rows, width = tile[1], sizes[5]
    ids, mask, relative_rows, carried, summed = pairs
    grad_summed, grad_scores = grad_pairs
    query_scale, scale = scales
    keys, values, kv_row, num_keys, low, high = piece_of(pieces, batch, head, tile, sizes, PIECE, BLOCK_M, WINDOWED)
    grad_keys, grad_values, grad_kv_row = piece_heads(grad_pieces[PIECE], batch, head)
    for start in range(low, high, BLOCK_N):
        key_index, at, key_mask, columns, valid, pair_ids, mask_bias = pair_tile(
            start, tile, sizes, num_keys, kv_row, ids, mask, PIECE, BLOCK_N, WINDOWED, HAS_RELATIVE)
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
            grad_weights = dropped(grad_weights, dropout, stream, element)
            weights = dropped(probs, dropout, stream, element)
        grad = scale * probs * (grad_weights - delta[:, None])
        if HAS_GRAD_SUMMED:
            grad += tl.load(grad_summed + columns, mask=valid, other=0.0).to(tl.float32)
        grad = tl.where(valid, grad, 0.0)
        if WRITE_GRAD_SCORES:
            tl.store(grad_scores + columns, grad.to(grad_scores.dtype.element_ty), mask=valid)
        grad_query += tl.dot(grad.to(key_tile.dtype), key_tile, input_precision=PRECISION)
        grad_at = key_index[:, None] * grad_kv_row + tile[3][None, :]
        tl.atomic_add(grad_keys + grad_at, tl.dot(tl.trans(grad.to(query.dtype)), query, input_precision=PRECISION)
                      * query_scale, mask=key_mask, sem="relaxed")
        tl.atomic_add(grad_values + grad_at, tl.dot(tl.trans(weights.to(grad_out.dtype)), grad_out,
                                                    input_precision=PRECISION), mask=key_mask, sem="relaxed")
    return grad_query


@triton.jit
def attention_backward(operands, summed, grad_summed, grad_scores, grad_context, statistics, grad_q, grad_pieces,
                       sizes, scales, dropout, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                       WINDOWED: tl.constexpr, HAS_RELATIVE: tl.constexpr, HAS_CARRIED: tl.constexpr,
                       SUMMED_SAVED: tl.constexpr, HAS_GRAD_SUMMED: tl.constexpr, WRITE_GRAD_SCORES: tl.constexpr,
                       DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    """A tile of queries of one head (program ids as attention_forward's): the weights recomputed from
    the rows' statistics (row_max, row_sum, delta), the gradient of the summed scores
    grad = scale * p * (dropout(grad_context @ v^T) - delta) + grad_summed
    (delta: the rows' sum of grad_context * context, computed by the caller), written; then
    grad_q = query_scale grad @ k (stored: the program holds the queries' every key) and, added
    atomically, grad_k += query_scale grad^T @ q, grad_v += dropout(p)^T @ grad_context."""
    stream, batch, head, tile, tile_mask, pairs, own_rows = one_head_program(operands, summed, sizes, BLOCK_M, D)
    rows, row_ok, dims = tile[1], tile[2], tile[3]
    query = tl.load(head_rows(operands[0], batch, head, rows[:, None]) + dims[None, :], mask=tile_mask, other=0.0)
    grad_out = tl.load(head_rows(grad_context, batch, head, rows[:, None]) + dims[None, :], mask=tile_mask,
                       other=0.0)
    stats = stream.to(tl.int64) * sizes[0] + rows
    row_max = tl.load(statistics[0] + stats, mask=row_ok, other=0.0)
    row_sum = tl.load(statistics[1] + stats, mask=row_ok, other=1.0)
    delta = tl.load(statistics[2] + stats, mask=row_ok, other=0.0)
    grad_pairs = (grad_summed + own_rows, grad_scores + own_rows)

    grad_query = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    for piece in tl.static_range(2):
        grad_query = _plain_piece_backward(
            grad_query, query, grad_out, delta, row_max, row_sum, tile, operands[1], grad_pieces, batch, head, stream,
            pairs, grad_pairs, sizes, scales, dropout, piece, BLOCK_M, BLOCK_N, WINDOWED, HAS_RELATIVE, HAS_CARRIED,
            SUMMED_SAVED, HAS_GRAD_SUMMED, WRITE_GRAD_SCORES, DROPOUT, PRECISION)
    tl.store(head_rows(grad_q, batch, head, rows[:, None]) + dims[None, :],
             (grad_query * scales[0]).to(grad_q[0].dtype.element_ty), mask=tile_mask)


@triton.jit
def _talking_piece_backward(
    grad_query, delta, grad_pre, grad_post, query_at, grad_out_at, tile_mask, row_max, row_sum, tile, pieces,
    grad_pieces, batch, heads, pairs, grad_pairs, mixes, sizes, scales, dropout, PIECE: tl.constexpr,
    HEADS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WINDOWED: tl.constexpr,
    HAS_RELATIVE: tl.constexpr, HAS_CARRIED: tl.constexpr, SUMMED_SAVED: tl.constexpr, HAS_GRAD_SUMMED: tl.constexpr,
    WRITE_GRAD_SCORES: tl.constexpr, DROPOUT: tl.constexpr, DELTA: tl.constexpr, PRECISION: tl.constexpr,
):
    """Piece PIECE of the keys of `talking_heads_backward` ([HEADS, M, N] tiles, arguments as in
    forward._talking_piece and _plain_piece_backward). DELTA: the first pass, which sums each mixed
    row's weights times their gradient (delta); otherwise the second, which returns the gradients.

    Each [HEADS, M | N, d] operand (queries at `query_at`, grad_context at `grad_out_at`, keys,
    values) is read from the cache right before the product that takes it: one such tile kept for
    a second product stays in shared memory meanwhile, and in float32 four of them at once (64 KB
    each at d = 64) would take more than a block has."""
    rows, width = tile[1], sizes[5]
    head, heads_ok, streams = heads
    ids, mask, relative_rows, carried, summed = pairs
    grad_summed, grad_scores = grad_pairs
    query_scale, scale = scales
    pre, post = mixes
    keys, values, kv_row, num_keys, low, high = piece_of(pieces, batch, head, tile, sizes, PIECE, BLOCK_M, WINDOWED)
    grad_keys, grad_values, grad_kv_row = piece_heads(grad_pieces[PIECE], batch, head)
    for start in range(low, high, BLOCK_N):
        key_index, at, key_mask, columns, valid, pair_ids, mask_bias = pair_tile(
            start, tile, sizes, num_keys, kv_row, ids, mask, PIECE, BLOCK_N, WINDOWED, HAS_RELATIVE)
        key_mask = heads_ok & key_mask
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
            grad_weights = dropped(grad_weights, dropout, streams, element)
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
                weights = dropped(weights, dropout, streams, element)
            operands = keys.dtype.element_ty
            grad = grad.to(operands)
            grad_query += tl.dot(grad, tl.load(keys + at, mask=key_mask, other=0.0), input_precision=PRECISION)
            grad_at = key_index[:, None] * grad_kv_row + tile[3][None, :]
            grad_keys_tile = tl.dot(tl.trans(grad), tl.load(query_at, mask=tile_mask, other=0.0),
                                    input_precision=PRECISION)
            tl.atomic_add(grad_keys + grad_at, grad_keys_tile * query_scale, mask=key_mask, sem="relaxed")
            grad_values_tile = tl.dot(tl.trans(weights.to(operands)), tl.load(grad_out_at, mask=tile_mask, other=0.0),
                                      input_precision=PRECISION)
            tl.atomic_add(grad_values + grad_at, grad_values_tile, mask=key_mask, sem="relaxed")
    return grad_query, delta, grad_pre, grad_post


@triton.jit
def talking_heads_backward(operands, summed, grad_summed, grad_scores, grad_context, statistics, grad_q, grad_pieces,
                           mixes, grad_mixes, sizes, scales, dropout, HEADS: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, D: tl.constexpr, WINDOWED: tl.constexpr, HAS_RELATIVE: tl.constexpr,
                           HAS_CARRIED: tl.constexpr, SUMMED_SAVED: tl.constexpr, HAS_GRAD_SUMMED: tl.constexpr,
                           WRITE_GRAD_SCORES: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    """A tile of queries of all heads (program ids as talking_heads_forward's), in two passes over the
    keys. With W = post P (then dropout), P = softmax(X), X = scale pre S + mask:
    grad_W = dropout(grad_context @ v^T), grad_P = post^T grad_W, delta = rowsum(P * grad_P) (first
    pass); grad_X = P (grad_P - delta), grad_S = scale pre^T grad_X + grad_summed (written),
    grad_pre += scale grad_X S^T, grad_post += grad_W P^T over the tile's pairs (this program's sums,
    into `grad_mixes` [programs, HEADS, HEADS]), and q, k, v's gradients as in attention_backward
    (second pass)."""
    batch, heads, tile, tile_mask, pairs, own_rows = all_heads_program(operands, summed, sizes, HEADS, BLOCK_M, D)
    head, rows, dims = heads[0], tile[1], tile[3]
    query_at = head_rows(operands[0], batch, head, rows[:, None]) + dims[None, :]
    grad_out_at = head_rows(grad_context, batch, head, rows[:, None]) + dims[None, :]
    stats, stats_mask = head_statistics(batch, sizes, tile, HEADS)
    row_max = tl.load(statistics[0] + stats, mask=stats_mask, other=0.0)
    row_sum = tl.load(statistics[1] + stats, mask=stats_mask, other=1.0)
    mixing, pre_mix, post_mix = head_mixes(mixes, HEADS)
    grad_pairs = (grad_summed + own_rows, grad_scores + own_rows)

    grad_query = tl.zeros((HEADS, BLOCK_M, D), dtype=tl.float32)
    delta = tl.zeros((HEADS, BLOCK_M), dtype=tl.float32)
    grad_pre = tl.zeros((HEADS, HEADS), dtype=tl.float32)
    grad_post = tl.zeros((HEADS, HEADS), dtype=tl.float32)
    for delta_pass in tl.static_range(2):
        for piece in tl.static_range(2):
            grad_query, delta, grad_pre, grad_post = _talking_piece_backward(
                grad_query, delta, grad_pre, grad_post, query_at, grad_out_at, tile_mask, row_max, row_sum, tile,
                operands[1], grad_pieces, batch, heads, pairs, grad_pairs, (pre_mix, post_mix), sizes, scales, dropout,
                piece, HEADS, BLOCK_M, BLOCK_N, WINDOWED, HAS_RELATIVE, HAS_CARRIED, SUMMED_SAVED, HAS_GRAD_SUMMED,
                WRITE_GRAD_SCORES, DROPOUT, delta_pass == 0, PRECISION)

    tl.store(head_rows(grad_q, batch, head, rows[:, None]) + dims[None, :],
             (grad_query * scales[0]).to(grad_q[0].dtype.element_ty), mask=tile_mask)
    program = (tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)).to(tl.int64) * HEADS * HEADS
    tl.store(grad_mixes[0] + program + mixing, grad_pre)
    tl.store(grad_mixes[1] + program + mixing, grad_post)
