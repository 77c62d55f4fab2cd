"""The forward kernels of one softmax (see longdoc.model.kernels.gpu): `attention_forward` (a
program per query tile and head) and `talking_heads_forward` (a program per query tile, all heads).

Their arguments are records.py's, as the launcher in longdoc.model.kernels.gpu.softmax builds them:
`operands` (records.Operands: q [B, h, Nq, d], the pieces' keys and values [B, h, N1 | N2, d],
relative [B, h, Nq, R], ids (int32) and mask [B, Nq, N], carried [B, h, Nq, N]); summed
[B, h, Nq, N], contiguous; the context [B, h, Nq, d] (records.HeadRows); `statistics`
(records.RowStatistics, which the backward reads); `sizes`, `scales`, `dropout`, and `flags`
(records.Flags: the compile-time choices, tiles among them).
"""

import triton
import triton.language as tl

from longdoc.model.kernels.gpu.tiles import (
    INITIAL_MAX, all_heads_program, dropped, head_rows, head_score_offset, head_scores, head_statistics,
    masked_logits, normalized_weights, one_head_program, online_softmax_step, pair_tile, piece_of, summed_scores,
)


@triton.jit
def _plain_piece(acc, row_max, row_sum, query, program, operands, pairs, sizes, scales, dropout, PIECE: tl.constexpr,
                 flags):
    """The online softmax over piece PIECE of the keys (0: the first, windowed if WINDOWED; 1: the
    second), a tile of BLOCK_N keys at a time. `program`: one_head_program's; `pairs`: the rows of
    its pairs (records.PairRows, [M, 1])."""
    tile = program.tile
    piece = piece_of(operands.pieces, program, sizes, PIECE, flags)
    for start in range(piece.low, piece.high, flags.BLOCK_N):
        keys = pair_tile(start, tile, sizes, piece, pairs, PIECE, flags)
        scores = summed_scores(query, tl.load(piece.keys + keys.at, mask=keys.key_ok, other=0.0), # [M, N]
                               scales.query_scale, keys.ids, pairs.relative, pairs.carried + keys.columns, keys.valid,
                               flags)
        if flags.WRITE_SUMMED:
            # The softmax reads the sums as stored (rounded to their dtype), as the backward and the next layer do.
            scores = scores.to(pairs.summed.dtype.element_ty).to(tl.float32)
            tl.store(pairs.summed + keys.columns, scores.to(pairs.summed.dtype.element_ty), mask=keys.valid)
        logits = masked_logits(scores, keys.mask_bias, keys.valid, scales.scale)
        numerators, correction, row_max, row_sum = online_softmax_step(logits, row_max, row_sum)
        if flags.DROPOUT:
            numerators = dropped(numerators, dropout, program.stream, tile.rows[:, None] * sizes.width + keys.columns)
        value_tile = tl.load(piece.key_values + keys.at, mask=keys.key_ok, other=0.0)  # [N, D]
        acc = acc * correction[:, None] + tl.dot(numerators.to(value_tile.dtype), value_tile,
                                                 input_precision=flags.PRECISION)
    return acc, row_max, row_sum


@triton.jit
def attention_forward(operands, summed, context, statistics, sizes, scales, dropout, flags):
    """A tile of BLOCK_M queries of one head (program ids: batch * heads + head, tile; the heads of a
    tile run next to each other, and read its rows of ids and mask from the cache) over its
    first piece of keys (window or all), then the second: summed scores (written if WRITE_SUMMED),
    online softmax, dropout, context = weights @ values; the rows' max and sum for the backward."""
    program, tile_mask, pairs, _ = one_head_program(operands, summed, sizes, flags)
    batch, head, tile = program.batch, program.head, program.tile
    query = tl.load(head_rows(operands.query, batch, head, tile.rows[:, None]) + tile.dims[None, :], mask=tile_mask,
                    other=0.0)  # [M, D]

    acc = tl.zeros((flags.BLOCK_M, flags.D), dtype=tl.float32)
    row_max = tl.full((flags.BLOCK_M,), INITIAL_MAX, dtype=tl.float32)
    row_sum = tl.zeros((flags.BLOCK_M,), dtype=tl.float32)
    for piece in tl.static_range(2):
        acc, row_max, row_sum = _plain_piece(acc, row_max, row_sum, query, program, operands, pairs, sizes, scales,
                                             dropout, piece, flags)

    out = acc / tl.where(tile.row_ok, row_sum, 1.0)[:, None]  # (rows past the end: no pair, no sum)
    tl.store(head_rows(context, batch, head, tile.rows[:, None]) + tile.dims[None, :],
             out.to(context.data.dtype.element_ty), mask=tile_mask)
    stats = program.stream.to(tl.int64) * sizes.num_queries + tile.rows  # [M]
    tl.store(statistics.row_max + stats, row_max, mask=tile.row_ok)
    tl.store(statistics.row_sum + stats, row_sum, mask=tile.row_ok)


@triton.jit
def _talking_piece(acc, row_max, row_sum, tile_mask, program, operands, pairs, mixes, sizes, scales, dropout,
                   PIECE: tl.constexpr, flags, STATISTICS: tl.constexpr):
    """Piece PIECE of the keys of `talking_heads_forward` (`program`: all_heads_program's; `pairs` its
    head 0's rows, as in _plain_piece; `mixes`: records.Mixes, pointers to pre, post [HEADS, HEADS]).
    A head at a time, each head's [M, N] summed scores are computed and added, times that head's
    column of pre, to the mixed scores of all heads [HEADS, M, N]. STATISTICS: the first pass (the
    mixed logits' row statistics); otherwise the second (the summed scores written, then a head at a
    time its weights, the mix by its row of post, dropout, and its context's part)."""
    tile = program.tile
    heads = tl.arange(0, flags.HEADS)[:, None, None]  # [HEADS, 1, 1]
    piece = piece_of(operands.pieces, program, sizes, PIECE, flags)
    for start in range(piece.low, piece.high, flags.BLOCK_N):
        keys = pair_tile(start, tile, sizes, piece, pairs, PIECE, flags)
        mixed = tl.zeros((flags.HEADS, flags.BLOCK_M, flags.BLOCK_N), dtype=tl.float32)
        for head in range(0, sizes.heads):
            scores = head_scores(head, program, tile_mask, operands, piece, keys, pairs, sizes, scales, flags)  # [M, N]
            if flags.WRITE_SUMMED:
                # As stored (rounded to their dtype), in both passes: what the backward and the next layer read.
                summed_at = pairs.summed + head_score_offset(head, sizes) + keys.columns
                scores = scores.to(pairs.summed.dtype.element_ty).to(tl.float32)
                if not STATISTICS:
                    # (written in the second pass: the sums may go over the carried scores, which both passes read)
                    tl.store(summed_at, scores.to(pairs.summed.dtype.element_ty), mask=keys.valid)
            mixed += tl.load(mixes.pre + heads * flags.HEADS + head) * scores[None, :, :]
        logits = masked_logits(mixed, keys.mask_bias[None, :, :], keys.valid[None, :, :], scales.scale)
        if STATISTICS:
            _, _, row_max, row_sum = online_softmax_step(logits, row_max, row_sum)
        else:
            probs = normalized_weights(logits, row_max, row_sum)  # [HEADS, M, N]
            for head in range(0, sizes.heads):
                weights = tl.sum(tl.load(mixes.post + head * flags.HEADS + heads) * probs, 0)  # [M, N]
                if flags.DROPOUT:
                    weights = dropped(weights, dropout, program.stream + head,
                                      tile.rows[:, None] * sizes.width + keys.columns)
                value_tile = tl.load(piece.key_values + head * piece.head_stride + keys.at, mask=keys.key_ok,
                                     other=0.0)  # [N, D]
                part = tl.dot(weights.to(value_tile.dtype), value_tile, input_precision=flags.PRECISION)  # [M, D]
                acc += tl.where(heads == head, part[None, :, :], 0.0)
    return acc, row_max, row_sum


@triton.jit
def talking_heads_forward(operands, summed, context, statistics, mixes, sizes, scales, dropout, flags):
    """A tile of BLOCK_M queries of all heads (padded to HEADS; program ids: tile, batch), in two
    passes over the keys: the summed scores a head at a time, mixed across heads by `pre`
    [HEADS, HEADS] (float32, zero-padded; `mixes`: records.Mixes), and the statistics of the mixed
    logits' rows; then the summed scores again (written if WRITE_SUMMED), the normalised weights,
    mixed by `post`, dropout, context = weights @ values, a head at a time. The program holds no
    [HEADS, .., D] tile but the context's accumulator: the queries, keys and values are read one
    head's [M | N, D] at a time (the queries from the cache)."""
    program, tile_mask, pairs, _ = all_heads_program(operands, summed, sizes, flags)
    batch, tile = program.batch, program.tile
    acc = tl.zeros((flags.HEADS, flags.BLOCK_M, flags.D), dtype=tl.float32)
    row_max = tl.full((flags.HEADS, flags.BLOCK_M), INITIAL_MAX, dtype=tl.float32)
    row_sum = tl.zeros((flags.HEADS, flags.BLOCK_M), dtype=tl.float32)
    for statistics_pass in tl.static_range(2):
        for piece in tl.static_range(2):
            acc, row_max, row_sum = _talking_piece(acc, row_max, row_sum, tile_mask, program, operands, pairs, mixes,
                                                   sizes, scales, dropout, piece, flags, statistics_pass == 0)

    heads = tl.arange(0, flags.HEADS)[:, None, None]
    tl.store(head_rows(context, batch, heads, tile.rows[None, :, None]) + tile.dims[None, None, :],
             acc.to(context.data.dtype.element_ty), mask=(heads < sizes.heads) & tile_mask[None, :, :])
    stats, stats_mask = head_statistics(batch, sizes, tile, flags)  # [HEADS, M]
    tl.store(statistics.row_max + stats, row_max, mask=stats_mask)
    tl.store(statistics.row_sum + stats, row_sum, mask=stats_mask)
