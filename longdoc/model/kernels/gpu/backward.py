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
    all_heads_program, dropped, head_rows, head_score_offset, head_scores, head_statistics, head_tile, masked_logits,
    normalized_weights, one_head_program, pair_tile, piece_heads, piece_of, saved_or_summed_scores,
)


@triton.jit
def _plain_piece_backward(grad_query, query, grad_out, delta, row_max, row_sum, program, operands, grad_pieces, pairs,
                          grad_pairs, sizes, scales, dropout, PIECE: tl.constexpr, flags):
    """Piece PIECE of the keys of `attention_backward` (arguments as forward._plain_piece's;
    `grad_pairs`: pointers to the rows of grad_summed and grad_scores): returns grad_query + this
    piece's part."""
    tile = program.tile
    grad_summed, grad_scores = grad_pairs
    piece = piece_of(operands.pieces, program, sizes, PIECE, flags)
    grad_keys, grad_values = piece_heads(grad_pieces[PIECE], program.batch, program.head)
    for start in range(piece.low, piece.high, flags.BLOCK_N):
        keys = pair_tile(start, tile, sizes, piece, pairs, PIECE, flags)
        key_tile = tl.load(piece.keys + keys.at, mask=keys.key_ok, other=0.0)  # [N, D]
        value_tile = tl.load(piece.key_values + keys.at, mask=keys.key_ok, other=0.0)  # [N, D]
        scores = saved_or_summed_scores(query, key_tile, scales.query_scale, keys.ids, pairs.relative, pairs.carried +
                                        keys.columns, pairs.summed + keys.columns, keys.valid, flags)  # [M, N]
        logits = masked_logits(scores, keys.mask_bias, keys.valid, scales.scale)
        probs = normalized_weights(logits, row_max, row_sum)
        # The gradient of the weights that multiplied the values, and those weights (after dropout).
        grad_weights = tl.dot(grad_out, tl.trans(value_tile), input_precision=flags.PRECISION)  # [M, N]
        weights = probs
        if flags.DROPOUT:
            element = tile.rows[:, None] * sizes.width + keys.columns
            grad_weights = dropped(grad_weights, dropout, program.stream, element)
            weights = dropped(probs, dropout, program.stream, element)
        grad = scales.scale * probs * (grad_weights - delta[:, None])
        if flags.HAS_GRAD_SUMMED:
            grad += tl.load(grad_summed + keys.columns, mask=keys.valid, other=0.0).to(tl.float32)
        grad = tl.where(keys.valid, grad, 0.0)
        if flags.WRITE_GRAD_SCORES:
            tl.store(grad_scores + keys.columns, grad.to(grad_scores.dtype.element_ty), mask=keys.valid)
        grad_query += tl.dot(grad.to(key_tile.dtype), key_tile, input_precision=flags.PRECISION)
        grad_at = keys.index[:, None] * grad_pieces[PIECE].row_stride + tile.dims[None, :]  # [N, D]
        tl.atomic_add(grad_keys + grad_at, tl.dot(tl.trans(grad.to(query.dtype)), query,
        input_precision=flags.PRECISION)
                      * scales.query_scale, mask=keys.key_ok, sem="relaxed")
        tl.atomic_add(grad_values + grad_at, tl.dot(tl.trans(weights.to(grad_out.dtype)), grad_out,
                                                    input_precision=flags.PRECISION), mask=keys.key_ok, sem="relaxed")
    return grad_query


@triton.jit
def attention_backward(operands, summed, grad_summed, grad_scores, grad_context, statistics, delta, grad_q, grad_pieces,
                       sizes, scales, dropout, flags):
    """A tile of queries of one head (program ids as attention_forward's): the weights recomputed from
    the rows' statistics (row_max, row_sum, delta), the gradient of the summed scores
    grad = scale * p * (dropout(grad_context @ v^T) - delta) + grad_summed
    (delta [B, h, Nq]: the rows' sum of grad_context * context, computed by the caller), written;
    then grad_q = query_scale grad @ k (stored: the program holds the queries' every key) and,
    added atomically, grad_k += query_scale grad^T @ q, grad_v += dropout(p)^T @ grad_context."""
    program, tile_mask, pairs, own_rows = one_head_program(operands, summed, sizes, flags)
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

    grad_query = tl.zeros((flags.BLOCK_M, flags.D), dtype=tl.float32)
    for piece in tl.static_range(2):
        grad_query = _plain_piece_backward(grad_query, query, grad_out, row_delta, row_max, row_sum, program, operands,
                                           grad_pieces, pairs, grad_pairs, sizes, scales, dropout, piece, flags)
    tl.store(head_rows(grad_q, batch, head, tile.rows[:, None]) + tile.dims[None, :],
             (grad_query * scales.query_scale).to(grad_q.data.dtype.element_ty), mask=tile_mask)


@triton.jit
def _head_summed(head, program, tile_mask, operands, piece, keys, pairs, sizes, scales, flags):
    """Head `head`'s summed scores [M, N] of a tile of talking_heads_backward's: read where the
    forward wrote them (SUMMED_SAVED: residual attention), else computed again (tiles.head_scores)."""
    if flags.SUMMED_SAVED:
        scores = tl.load(pairs.summed + head_score_offset(head, sizes) + keys.columns, mask=keys.valid,
                         other=0.0).to(tl.float32)
    else:
        scores = head_scores(head, program, tile_mask, operands, piece, keys, pairs, sizes, scales, flags)
    return scores


@triton.jit
def _talking_piece_backward(delta, grad_pre, grad_post, tile_mask, row_max, row_sum, program, operands, grad_context,
                            grad_q, grad_pieces, pairs, grad_pairs, mixes, sizes, scales, dropout, PIECE: tl.constexpr,
                            flags, DELTA: tl.constexpr):
    """Piece PIECE of the keys of `talking_heads_backward` (arguments as in forward._talking_piece and
    _plain_piece_backward). DELTA: the first pass, which sums each mixed row's weights times their
    gradient (delta); otherwise the second, which returns the gradients.

    As in the forward, the queries, keys, values and the context's gradient are read one head's
    [M | N, D] at a time, and the mixes are sums over heads of [M, N] tiles: of the summed scores
    (by pre's columns), of the weights' gradients (by post's rows), of the logits' gradients (by
    pre's rows), so that at most two [HEADS, M, N] tiles are live."""
    tile = program.tile
    heads = tl.arange(0, flags.HEADS)[:, None, None]  # [HEADS, 1, 1]
    mix_rows = tl.arange(0, flags.HEADS)[:, None]  # [HEADS, 1]: grad_pre's and grad_post's rows
    grad_summed, grad_scores = grad_pairs
    piece = piece_of(operands.pieces, program, sizes, PIECE, flags)
    grad_piece = grad_pieces[PIECE]
    grad_keys, grad_values = piece_heads(grad_piece, program.batch, program.head)
    for start in range(piece.low, piece.high, flags.BLOCK_N):
        keys = pair_tile(start, tile, sizes, piece, pairs, PIECE, flags)
        grad_at = keys.index[:, None] * grad_piece.row_stride + tile.dims[None, :]  # [N, D]
        mixed = tl.zeros((flags.HEADS, flags.BLOCK_M, flags.BLOCK_N), dtype=tl.float32)
        for head in range(0, sizes.heads):
            mixed += tl.load(mixes.pre + heads * flags.HEADS + head) * _head_summed(head, program, tile_mask, operands,
                             piece, keys, pairs, sizes, scales, flags)[None, :, :]
        logits = masked_logits(mixed, keys.mask_bias[None, :, :], keys.valid[None, :, :], scales.scale)
        probs = tl.where(program.head_ok, normalized_weights(logits, row_max, row_sum), 0.0)  # (no padding heads)
        # grad_probs = post^T grad_W, a head's grad_W (the gradient of its weights, dropout's kept ones) at a time.
        element = tile.rows[:, None] * sizes.width + keys.columns  # [M, N]
        grad_probs = tl.zeros((flags.HEADS, flags.BLOCK_M, flags.BLOCK_N), dtype=tl.float32)
        for head in range(0, sizes.heads):
            grad_out = tl.load(head_tile(grad_context, program, head), mask=tile_mask, other=0.0)  # [M, D]
            value_tile = tl.load(piece.key_values + head * piece.head_stride + keys.at, mask=keys.key_ok, other=0.0)
            grad_weights = tl.dot(grad_out, tl.trans(value_tile), input_precision=flags.PRECISION)  # [M, N]
            if flags.DROPOUT:
                grad_weights = dropped(grad_weights, dropout, program.stream + head, element)
            grad_probs += tl.load(mixes.post + head * flags.HEADS + heads) * grad_weights[None, :, :]
            if not DELTA:
                grad_post += tl.where(mix_rows == head, tl.sum(tl.sum(grad_weights[None, :, :] * probs, 2), 1)[None, :],
                                      0.0)
                weights = tl.sum(tl.load(mixes.post + head * flags.HEADS + heads) * probs, 0)  # [M, N]
                if flags.DROPOUT:
                    weights = dropped(weights, dropout, program.stream + head, element)
                tl.atomic_add(grad_values + head * grad_piece.head_stride + grad_at,
                              tl.dot(tl.trans(weights.to(grad_out.dtype)), grad_out, input_precision=flags.PRECISION),
                              mask=keys.key_ok, sem="relaxed")
        if DELTA:
            delta += tl.sum(probs * grad_probs, -1)
        else:
            grad_logits = probs * (grad_probs - tl.expand_dims(delta, -1))  # [HEADS, M, N]
            for head in range(0, sizes.heads):
                own = head_score_offset(head, sizes) + keys.columns
                head_summed = _head_summed(head, program, tile_mask, operands, piece, keys, pairs, sizes, scales, flags)
                # grad_pre[:, head] += scale grad_X S_head^T; grad_S_head = scale pre[:, head]^T grad_X
                by_row = tl.sum(tl.sum(grad_logits * head_summed[None, :, :], 2), 1)  # [HEADS]
                grad_pre += tl.where(tl.arange(0, flags.HEADS)[None, :] == head, scales.scale * by_row[:, None], 0.0)
                grad = scales.scale * tl.sum(tl.load(mixes.pre + heads * flags.HEADS + head) * grad_logits, 0)  # [M, N]
                if flags.HAS_GRAD_SUMMED:
                    grad += tl.load(grad_summed + own, mask=keys.valid, other=0.0).to(tl.float32)
                grad = tl.where(keys.valid, grad, 0.0)
                if flags.WRITE_GRAD_SCORES:
                    tl.store(grad_scores + own, grad.to(grad_scores.dtype.element_ty), mask=keys.valid)
                query = tl.load(head_tile(operands.query, program, head), mask=tile_mask, other=0.0)  # [M, D]
                key_tile = tl.load(piece.keys + head * piece.head_stride + keys.at, mask=keys.key_ok, other=0.0)
                grad = grad.to(key_tile.dtype)
                # (added, as the keys' are: an accumulator of all heads' [M, D] would not fit in the registers)
                tl.atomic_add(head_tile(grad_q, program, head),
                              tl.dot(grad, key_tile, input_precision=flags.PRECISION) * scales.query_scale,
                              mask=tile_mask,
                              sem="relaxed")
                tl.atomic_add(grad_keys + head * grad_piece.head_stride + grad_at,
                              tl.dot(tl.trans(grad), query, input_precision=flags.PRECISION) * scales.query_scale,
                              mask=keys.key_ok, sem="relaxed")
    return delta, grad_pre, grad_post


@triton.jit
def talking_heads_backward(operands, summed, grad_summed, grad_scores, grad_context, statistics, grad_q, grad_pieces,
                           mixes, grad_mixes, sizes, scales, dropout, flags):
    """A tile of queries of all heads (program ids as talking_heads_forward's), in two passes over the
    keys. With W = post P (then dropout), P = softmax(X), X = scale pre S + mask:
    grad_W = dropout(grad_context @ v^T), grad_P = post^T grad_W, delta = rowsum(P * grad_P) (first
    pass); grad_X = P (grad_P - delta), grad_S = scale pre^T grad_X + grad_summed (written),
    grad_pre += scale grad_X S^T, grad_post += grad_W P^T over the tile's pairs (this program's sums,
    into `grad_mixes` (records.Mixes) [programs, HEADS, HEADS]), and q, k, v's gradients as in
    attention_backward (second pass)."""
    program, tile_mask, pairs, own_rows = all_heads_program(operands, summed, sizes, flags)
    batch, tile = program.batch, program.tile
    stats, stats_mask = head_statistics(batch, sizes, tile, flags)  # [HEADS, M]
    row_max = tl.load(statistics.row_max + stats, mask=stats_mask, other=0.0)
    row_sum = tl.load(statistics.row_sum + stats, mask=stats_mask, other=1.0)
    mixing = tl.arange(0, flags.HEADS)[:, None] * flags.HEADS + tl.arange(0, flags.HEADS)[None, :]  # [HEADS, HEADS]
    grad_pairs = (grad_summed + own_rows, grad_scores + own_rows)

    delta = tl.zeros((flags.HEADS, flags.BLOCK_M), dtype=tl.float32)
    grad_pre = tl.zeros((flags.HEADS, flags.HEADS), dtype=tl.float32)
    grad_post = tl.zeros((flags.HEADS, flags.HEADS), dtype=tl.float32)
    for delta_pass in tl.static_range(2):
        for piece in tl.static_range(2):
            delta, grad_pre, grad_post = _talking_piece_backward(delta, grad_pre, grad_post, tile_mask, row_max,
                                                                 row_sum, program, operands, grad_context, grad_q,
                                                                 grad_pieces, pairs, grad_pairs, mixes, sizes, scales,
                                                                 dropout, piece, flags, delta_pass == 0)

    programs = (tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)).to(tl.int64) * flags.HEADS * flags.HEADS
    tl.store(grad_mixes.pre + programs + mixing, grad_pre)
    tl.store(grad_mixes.post + programs + mixing, grad_post)
