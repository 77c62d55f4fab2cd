"""The backward kernels of one softmax (see longdoc.model.kernels.gpu): `attention_backward` (a
program per query tile and head) and `talking_heads_backward` (a program per query tile, all
heads). They take the forward's `operands` and summed scores (forward.py), the gradient of the summed
scores carried on (grad_summed [B, h, Nq, N], contiguous), the gradient of the context [B, h, Nq,
d] (records.HeadRows), the forward's statistics (records.RowStatistics; and without talking heads
each row's delta); they write grad_scores [B, h, Nq, N] (of the summed scores: also those of the
picked relative terms and of the carried scores) and the gradient of q (records.HeadRows), and add
those of the keys and values atomically (`grad_pieces`, as the forward's pieces: float32 tensors
shaped like the projections).
"""

import triton
import triton.language as tl

from longdoc.model.kernels.gpu.tiles import (
    all_heads_program, dropped, head_mixes, head_rows, head_statistics, masked_logits, mix_heads, normalized_weights,
    one_head_program, pair_tile, piece_heads, piece_of, saved_or_summed_scores,
)


@triton.jit
def _plain_piece_backward(grad_query, query, grad_out, delta, row_max, row_sum, program, operands, grad_pieces, pairs,
                          grad_pairs, sizes, scales, dropout, PIECE: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, WINDOWED: tl.constexpr, HAS_RELATIVE: tl.constexpr,
                          HAS_CARRIED: tl.constexpr, SUMMED_SAVED: tl.constexpr, HAS_GRAD_SUMMED: tl.constexpr,
                          WRITE_GRAD_SCORES: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    """Piece PIECE of the keys of `attention_backward` (arguments as forward._plain_piece's;
    `grad_pairs`: pointers to the rows of grad_summed and grad_scores): returns grad_query + this
    piece's part."""
    tile = program.tile
    grad_summed, grad_scores = grad_pairs
    piece = piece_of(operands.pieces, program, sizes, PIECE, WINDOWED)
    grad_keys, grad_values = piece_heads(grad_pieces[PIECE], program.batch, program.head)
    for start in range(piece.low, piece.high, BLOCK_N):
        keys = pair_tile(start, tile, sizes, piece, pairs, PIECE, BLOCK_N, WINDOWED, HAS_RELATIVE)
        key_tile = tl.load(piece.keys + keys.at, mask=keys.key_ok, other=0.0)  # [N, D]
        value_tile = tl.load(piece.key_values + keys.at, mask=keys.key_ok, other=0.0)  # [N, D]
        scores = saved_or_summed_scores(query, key_tile, scales.query_scale, keys.ids, pairs.relative,
                                        pairs.carried + keys.columns, pairs.summed + keys.columns, keys.valid,
                                        HAS_RELATIVE, HAS_CARRIED, SUMMED_SAVED, PRECISION)  # [M, N]
        logits = masked_logits(scores, keys.mask_bias, keys.valid, scales.scale)
        probs = normalized_weights(logits, row_max, row_sum)
        # The gradient of the weights that multiplied the values, and those weights (after dropout).
        grad_weights = tl.dot(grad_out, tl.trans(value_tile), input_precision=PRECISION)  # [M, N]
        weights = probs
        if DROPOUT:
            element = tile.rows[:, None] * sizes.width + keys.columns
            grad_weights = dropped(grad_weights, dropout, program.stream, element)
            weights = dropped(probs, dropout, program.stream, element)
        grad = scales.scale * probs * (grad_weights - delta[:, None])
        if HAS_GRAD_SUMMED:
            grad += tl.load(grad_summed + keys.columns, mask=keys.valid, other=0.0).to(tl.float32)
        grad = tl.where(keys.valid, grad, 0.0)
        if WRITE_GRAD_SCORES:
            tl.store(grad_scores + keys.columns, grad.to(grad_scores.dtype.element_ty), mask=keys.valid)
        grad_query += tl.dot(grad.to(key_tile.dtype), key_tile, input_precision=PRECISION)
        grad_at = keys.index[:, None] * grad_pieces[PIECE].row_stride + tile.dims[None, :]  # [N, D]
        tl.atomic_add(grad_keys + grad_at, tl.dot(tl.trans(grad.to(query.dtype)), query, input_precision=PRECISION)
                      * scales.query_scale, mask=keys.key_ok, sem="relaxed")
        tl.atomic_add(grad_values + grad_at, tl.dot(tl.trans(weights.to(grad_out.dtype)), grad_out,
                                                    input_precision=PRECISION), mask=keys.key_ok, sem="relaxed")
    return grad_query


@triton.jit
def attention_backward(operands, summed, grad_summed, grad_scores, grad_context, statistics, delta, grad_q,
                       grad_pieces, sizes, scales, dropout, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       D: tl.constexpr, WINDOWED: tl.constexpr, HAS_RELATIVE: tl.constexpr, HAS_CARRIED: tl.constexpr,
                       SUMMED_SAVED: tl.constexpr, HAS_GRAD_SUMMED: tl.constexpr, WRITE_GRAD_SCORES: tl.constexpr,
                       DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    """A tile of queries of one head (program ids as attention_forward's): the weights recomputed from
    the rows' statistics (row_max, row_sum, delta), the gradient of the summed scores
    grad = scale * p * (dropout(grad_context @ v^T) - delta) + grad_summed
    (delta [B, h, Nq]: the rows' sum of grad_context * context, computed by the caller), written;
    then grad_q = query_scale grad @ k (stored: the program holds the queries' every key) and,
    added atomically, grad_k += query_scale grad^T @ q, grad_v += dropout(p)^T @ grad_context."""
    program, tile_mask, pairs, own_rows = one_head_program(operands, summed, sizes, BLOCK_M, D, WINDOWED)
    batch, head, tile = program.batch, program.head, program.tile
    query = tl.load(head_rows(operands.query, batch, head, tile.rows[:, None]) + tile.dims[None, :], mask=tile_mask,
                    other=0.0)  # [M, D]
    grad_out = tl.load(head_rows(grad_context, batch, head, tile.rows[:, None]) + tile.dims[None, :],
                       mask=tile_mask, other=0.0)  # [M, D]
    stats = program.stream.to(tl.int64) * sizes.num_queries + tile.rows  # [M]
    row_max = tl.load(statistics.row_max + stats, mask=tile.row_ok, other=0.0)
    row_sum = tl.load(statistics.row_sum + stats, mask=tile.row_ok, other=1.0)
    row_delta = tl.load(delta + stats, mask=tile.row_ok, other=0.0)
    grad_pairs = (grad_summed + own_rows, grad_scores + own_rows)

    grad_query = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    for piece in tl.static_range(2):
        grad_query = _plain_piece_backward(
            grad_query, query, grad_out, row_delta, row_max, row_sum, program, operands, grad_pieces, pairs,
            grad_pairs, sizes, scales, dropout, piece, BLOCK_M, BLOCK_N, WINDOWED, HAS_RELATIVE, HAS_CARRIED,
            SUMMED_SAVED, HAS_GRAD_SUMMED, WRITE_GRAD_SCORES, DROPOUT, PRECISION)
    tl.store(head_rows(grad_q, batch, head, tile.rows[:, None]) + tile.dims[None, :],
             (grad_query * scales.query_scale).to(grad_q.data.dtype.element_ty), mask=tile_mask)


@triton.jit
def _talking_piece_backward(
    grad_query, delta, grad_pre, grad_post, query_at, grad_out_at, tile_mask, row_max, row_sum, program, operands,
    grad_pieces, pairs, grad_pairs, mixes, sizes, scales, dropout, PIECE: tl.constexpr, HEADS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WINDOWED: tl.constexpr, HAS_RELATIVE: tl.constexpr,
    HAS_CARRIED: tl.constexpr, SUMMED_SAVED: tl.constexpr, HAS_GRAD_SUMMED: tl.constexpr,
    WRITE_GRAD_SCORES: tl.constexpr, DROPOUT: tl.constexpr, DELTA: tl.constexpr, PRECISION: tl.constexpr,
):
    """Piece PIECE of the keys of `talking_heads_backward` ([HEADS, M, N] tiles, arguments as in
    forward._talking_piece and _plain_piece_backward). DELTA: the first pass, which sums each mixed
    row's weights times their gradient (delta); otherwise the second, which returns the gradients.

    Each [HEADS, M | N, d] operand (queries at `query_at`, grad_context at `grad_out_at`, keys,
    values) is read from the cache right before the product that takes it: one such tile kept for
    a second product stays in shared memory meanwhile, and in float32 four of them at once (64 KB
    each at d = 64) would take more than a block has."""
    tile, head_ok = program.tile, program.head_ok
    grad_summed, grad_scores = grad_pairs
    piece = piece_of(operands.pieces, program, sizes, PIECE, WINDOWED)
    grad_keys, grad_values = piece_heads(grad_pieces[PIECE], program.batch, program.head)
    for start in range(piece.low, piece.high, BLOCK_N):
        keys = pair_tile(start, tile, sizes, piece, pairs, PIECE, BLOCK_N, WINDOWED, HAS_RELATIVE)
        key_ok = head_ok & keys.key_ok  # [HEADS, N, D]
        head_valid = head_ok & keys.valid[None, :, :]  # [HEADS, M, N]
        scores = saved_or_summed_scores(tl.load(query_at, mask=tile_mask, other=0.0),
                                        tl.load(piece.keys + keys.at, mask=key_ok, other=0.0), scales.query_scale,
                                        keys.ids[None, :, :], pairs.relative, pairs.carried + keys.columns[None, :, :],
                                        pairs.summed + keys.columns[None, :, :], head_valid, HAS_RELATIVE,
                                        HAS_CARRIED, SUMMED_SAVED, PRECISION)  # [HEADS, M, N]
        logits = masked_logits(mix_heads(mixes.pre, scores, HEADS, BLOCK_M, BLOCK_N, PRECISION),
                               keys.mask_bias[None, :, :], keys.valid[None, :, :], scales.scale)
        probs = tl.where(head_ok, normalized_weights(logits, row_max, row_sum), 0.0)  # (no padding heads)
        # The gradients of the weights that multiplied the values (dropout's kept ones), then of the softmax's.
        grad_weights = tl.dot(tl.load(grad_out_at, mask=tile_mask, other=0.0),
                              tl.trans(tl.load(piece.key_values + keys.at, mask=key_ok, other=0.0)),
                              input_precision=PRECISION)  # [HEADS, M, N]
        element = (tile.rows[:, None] * sizes.width + keys.columns)[None, :, :]
        if DROPOUT:
            grad_weights = dropped(grad_weights, dropout, program.stream, element)
        grad_probs = mix_heads(tl.trans(mixes.post), grad_weights, HEADS, BLOCK_M, BLOCK_N, PRECISION)
        if DELTA:
            delta += tl.sum(probs * grad_probs, -1)
        else:
            grad_logits = probs * (grad_probs - tl.expand_dims(delta, -1))
            grad = scales.scale * mix_heads(tl.trans(mixes.pre), grad_logits, HEADS, BLOCK_M, BLOCK_N, PRECISION)
            if HAS_GRAD_SUMMED:
                grad += tl.load(grad_summed + keys.columns[None, :, :], mask=head_valid, other=0.0).to(tl.float32)
            grad = tl.where(head_valid, grad, 0.0)
            if WRITE_GRAD_SCORES:
                tl.store(grad_scores + keys.columns[None, :, :], grad.to(grad_scores.dtype.element_ty),
                         mask=head_valid)
            grad_pre += scales.scale * tl.dot(tl.reshape(grad_logits, (HEADS, BLOCK_M * BLOCK_N)),
                                              tl.trans(tl.reshape(scores, (HEADS, BLOCK_M * BLOCK_N))),
                                              input_precision=PRECISION)
            grad_post += tl.dot(tl.reshape(grad_weights, (HEADS, BLOCK_M * BLOCK_N)),
                                tl.trans(tl.reshape(probs, (HEADS, BLOCK_M * BLOCK_N))), input_precision=PRECISION)
            weights = mix_heads(mixes.post, probs, HEADS, BLOCK_M, BLOCK_N, PRECISION)
            if DROPOUT:
                weights = dropped(weights, dropout, program.stream, element)
            operand_type = piece.keys.dtype.element_ty
            grad = grad.to(operand_type)
            grad_query += tl.dot(grad, tl.load(piece.keys + keys.at, mask=key_ok, other=0.0),
                                 input_precision=PRECISION)
            grad_at = keys.index[:, None] * grad_pieces[PIECE].row_stride + tile.dims[None, :]  # [N, D]
            grad_keys_tile = tl.dot(tl.trans(grad), tl.load(query_at, mask=tile_mask, other=0.0),
                                    input_precision=PRECISION)
            tl.atomic_add(grad_keys + grad_at, grad_keys_tile * scales.query_scale, mask=key_ok, sem="relaxed")
            grad_values_tile = tl.dot(tl.trans(weights.to(operand_type)),
                                      tl.load(grad_out_at, mask=tile_mask, other=0.0), input_precision=PRECISION)
            tl.atomic_add(grad_values + grad_at, grad_values_tile, mask=key_ok, sem="relaxed")
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
    into `grad_mixes` (records.Mixes) [programs, HEADS, HEADS]), and q, k, v's gradients as in
    attention_backward (second pass)."""
    program, tile_mask, pairs, own_rows = all_heads_program(operands, summed, sizes, HEADS, BLOCK_M, D, WINDOWED)
    batch, head, tile = program.batch, program.head, program.tile
    query_at = head_rows(operands.query, batch, head, tile.rows[:, None]) + tile.dims[None, :]  # [HEADS, M, D]
    grad_out_at = head_rows(grad_context, batch, head, tile.rows[:, None]) + tile.dims[None, :]  # [HEADS, M, D]
    stats, stats_mask = head_statistics(batch, sizes, tile, HEADS)  # [HEADS, M]
    row_max = tl.load(statistics.row_max + stats, mask=stats_mask, other=0.0)
    row_sum = tl.load(statistics.row_sum + stats, mask=stats_mask, other=1.0)
    mixing, mix_values = head_mixes(mixes, HEADS)
    grad_pairs = (grad_summed + own_rows, grad_scores + own_rows)

    grad_query = tl.zeros((HEADS, BLOCK_M, D), dtype=tl.float32)
    delta = tl.zeros((HEADS, BLOCK_M), dtype=tl.float32)
    grad_pre = tl.zeros((HEADS, HEADS), dtype=tl.float32)
    grad_post = tl.zeros((HEADS, HEADS), dtype=tl.float32)
    for delta_pass in tl.static_range(2):
        for piece in tl.static_range(2):
            grad_query, delta, grad_pre, grad_post = _talking_piece_backward(
                grad_query, delta, grad_pre, grad_post, query_at, grad_out_at, tile_mask, row_max, row_sum, program,
                operands, grad_pieces, pairs, grad_pairs, mix_values, sizes, scales, dropout, piece, HEADS, BLOCK_M,
                BLOCK_N, WINDOWED, HAS_RELATIVE, HAS_CARRIED, SUMMED_SAVED, HAS_GRAD_SUMMED, WRITE_GRAD_SCORES,
                DROPOUT, delta_pass == 0, PRECISION)

    tl.store(head_rows(grad_q, batch, head, tile.rows[:, None]) + tile.dims[None, :],
             (grad_query * scales.query_scale).to(grad_q.data.dtype.element_ty), mask=tile_mask)
    programs = (tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)).to(tl.int64) * HEADS * HEADS
    tl.store(grad_mixes.pre + programs + mixing, grad_pre)
    tl.store(grad_mixes.post + programs + mixing, grad_post)
