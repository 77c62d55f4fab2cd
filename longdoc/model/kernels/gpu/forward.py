"""The forward kernels of one softmax (see longdoc.model.kernels.gpu): `attention_forward` (a
program per query tile and head) and `talking_heads_forward` (a program per query tile, all heads).

Their arguments are records.py's, as the launcher in longdoc.model.kernels.gpu.softmax builds them:
`operands` (records.Operands: q [B, h, Nq, d], the pieces' keys and values [B, h, N1 | N2, d],
relative [B, h, Nq, R], ids (int32) and mask [B, Nq, N], carried [B, h, Nq, N]); summed
[B, h, Nq, N], contiguous; the context [B, h, Nq, d] (records.HeadRows); `statistics`
(records.RowStatistics, which the backward reads); `sizes`, `scales`, `dropout`.
"""

import triton
import triton.language as tl

from longdoc.model.kernels.gpu.tiles import (
    INITIAL_MAX, all_heads_program, dropped, head_mixes, head_rows, head_statistics, masked_logits, mix_heads,
    normalized_weights, one_head_program, online_softmax_step, pair_tile, piece_of, summed_scores,
)


@triton.jit
def _plain_piece(acc, row_max, row_sum, query, program, operands, pairs, sizes, scales, dropout,
                 PIECE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WINDOWED: tl.constexpr,
                 HAS_RELATIVE: tl.constexpr, HAS_CARRIED: tl.constexpr, WRITE_SUMMED: tl.constexpr,
                 DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    """The online softmax over piece PIECE of the keys (0: the first, windowed if WINDOWED; 1: the
    second), a tile of BLOCK_N keys at a time. `program`: one_head_program's; `pairs`: the rows of
    its pairs (records.PairRows, [M, 1])."""
    tile = program.tile
    piece = piece_of(operands.pieces, program, sizes, PIECE, WINDOWED)
    for start in range(piece.low, piece.high, BLOCK_N):
        keys = pair_tile(start, tile, sizes, piece, pairs, PIECE, BLOCK_N, WINDOWED, HAS_RELATIVE)
        scores = summed_scores(query, tl.load(piece.keys + keys.at, mask=keys.key_ok, other=0.0),  # [M, N]
                               scales.query_scale, keys.ids, pairs.relative, pairs.carried + keys.columns, keys.valid,
                               HAS_RELATIVE, HAS_CARRIED, PRECISION)
        if WRITE_SUMMED:
            # The softmax reads the sums as stored (rounded to their dtype), as the backward and the next layer do.
            scores = scores.to(pairs.summed.dtype.element_ty).to(tl.float32)
            tl.store(pairs.summed + keys.columns, scores.to(pairs.summed.dtype.element_ty), mask=keys.valid)
        logits = masked_logits(scores, keys.mask_bias, keys.valid, scales.scale)
        numerators, correction, row_max, row_sum = online_softmax_step(logits, row_max, row_sum)
        if DROPOUT:
            numerators = dropped(numerators, dropout, program.stream, tile.rows[:, None] * sizes.width + keys.columns)
        value_tile = tl.load(piece.key_values + keys.at, mask=keys.key_ok, other=0.0)  # [N, D]
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
    program, tile_mask, pairs, _ = one_head_program(operands, summed, sizes, BLOCK_M, D, WINDOWED)
    batch, head, tile = program.batch, program.head, program.tile
    query = tl.load(head_rows(operands.query, batch, head, tile.rows[:, None]) + tile.dims[None, :], mask=tile_mask,
                    other=0.0)  # [M, D]

    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    row_max = tl.full((BLOCK_M,), INITIAL_MAX, dtype=tl.float32)
    row_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for piece in tl.static_range(2):
        acc, row_max, row_sum = _plain_piece(
            acc, row_max, row_sum, query, program, operands, pairs, sizes, scales, dropout, piece, BLOCK_M, BLOCK_N,
            WINDOWED, HAS_RELATIVE, HAS_CARRIED, WRITE_SUMMED, DROPOUT, PRECISION)

    out = acc / tl.where(tile.row_ok, row_sum, 1.0)[:, None]  # (rows past the end: no pair, no sum)
    tl.store(head_rows(context, batch, head, tile.rows[:, None]) + tile.dims[None, :],
             out.to(context.data.dtype.element_ty), mask=tile_mask)
    stats = program.stream.to(tl.int64) * sizes.num_queries + tile.rows  # [M]
    tl.store(statistics.row_max + stats, row_max, mask=tile.row_ok)
    tl.store(statistics.row_sum + stats, row_sum, mask=tile.row_ok)


@triton.jit
def _talking_piece(acc, row_max, row_sum, query_at, tile_mask, program, operands, pairs, mixes, sizes, scales,
                   dropout, PIECE: tl.constexpr, HEADS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   WINDOWED: tl.constexpr, HAS_RELATIVE: tl.constexpr, HAS_CARRIED: tl.constexpr,
                   WRITE_SUMMED: tl.constexpr, DROPOUT: tl.constexpr, STATISTICS: tl.constexpr,
                   PRECISION: tl.constexpr):
    """Piece PIECE of the keys of `talking_heads_forward`, all heads ([HEADS, M, N] tiles; `program`:
    all_heads_program's; `pairs` as in _plain_piece, the relative terms, carried and summed scores
    per head ([HEADS, M, 1]); `mixes`: the values of pre, post [HEADS, HEADS]). STATISTICS: the
    first pass (the mixed logits' row statistics); otherwise the second (the summed scores written,
    weights mixed by `post`, dropout, context)."""
    tile, head_ok = program.tile, program.head_ok
    piece = piece_of(operands.pieces, program, sizes, PIECE, WINDOWED)
    for start in range(piece.low, piece.high, BLOCK_N):
        keys = pair_tile(start, tile, sizes, piece, pairs, PIECE, BLOCK_N, WINDOWED, HAS_RELATIVE)
        key_ok = head_ok & keys.key_ok  # [HEADS, N, D]
        head_valid = head_ok & keys.valid[None, :, :]  # [HEADS, M, N]
        # (the queries read in each step, from the cache, as in backward._talking_piece_backward)
        scores = summed_scores(tl.load(query_at, mask=tile_mask, other=0.0),
                               tl.load(piece.keys + keys.at, mask=key_ok, other=0.0), scales.query_scale,
                               keys.ids[None, :, :], pairs.relative, pairs.carried + keys.columns[None, :, :],
                               head_valid, HAS_RELATIVE, HAS_CARRIED, PRECISION)  # [HEADS, M, N]
        if WRITE_SUMMED:
            # As stored (rounded to their dtype), in both passes: what the backward and the next layer read.
            scores = scores.to(pairs.summed.dtype.element_ty).to(tl.float32)
        logits = masked_logits(mix_heads(mixes.pre, scores, HEADS, BLOCK_M, BLOCK_N, PRECISION),
                               keys.mask_bias[None, :, :], keys.valid[None, :, :], scales.scale)
        if STATISTICS:
            _, _, row_max, row_sum = online_softmax_step(logits, row_max, row_sum)
        else:
            # (written in the second pass: the sums may go over the carried scores, which both passes read)
            if WRITE_SUMMED:
                tl.store(pairs.summed + keys.columns[None, :, :], scores.to(pairs.summed.dtype.element_ty),
                         mask=head_valid)
            weights = mix_heads(mixes.post, normalized_weights(logits, row_max, row_sum), HEADS, BLOCK_M, BLOCK_N,
                                PRECISION)
            if DROPOUT:
                weights = dropped(weights, dropout, program.stream,
                                  (tile.rows[:, None] * sizes.width + keys.columns)[None, :, :])
            value_tile = tl.load(piece.key_values + keys.at, mask=key_ok, other=0.0)  # [HEADS, N, D]
            acc += tl.dot(weights.to(value_tile.dtype), value_tile, input_precision=PRECISION)
    return acc, row_max, row_sum


@triton.jit
def talking_heads_forward(operands, summed, context, statistics, mixes, sizes, scales, dropout,
                          HEADS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                          WINDOWED: tl.constexpr, HAS_RELATIVE: tl.constexpr, HAS_CARRIED: tl.constexpr,
                          WRITE_SUMMED: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    """A tile of BLOCK_M queries of all heads (padded to HEADS; program ids: tile, batch), in two
    passes over the keys: the summed scores per head, mixed across heads by `pre` [HEADS, HEADS]
    (float32, zero-padded; `mixes`: records.Mixes), and the statistics of the mixed logits' rows;
    then the summed scores again (written if WRITE_SUMMED), the normalised weights, mixed by `post`,
    dropout, context = weights @ values per head."""
    program, tile_mask, pairs, _ = all_heads_program(operands, summed, sizes, HEADS, BLOCK_M, D, WINDOWED)
    batch, head, tile = program.batch, program.head, program.tile
    query_at = head_rows(operands.query, batch, head, tile.rows[:, None]) + tile.dims[None, :]  # [HEADS, M, D]
    _, mix_values = head_mixes(mixes, HEADS)

    acc = tl.zeros((HEADS, BLOCK_M, D), dtype=tl.float32)
    row_max = tl.full((HEADS, BLOCK_M), INITIAL_MAX, dtype=tl.float32)
    row_sum = tl.zeros((HEADS, BLOCK_M), dtype=tl.float32)
    for statistics_pass in tl.static_range(2):
        for piece in tl.static_range(2):
            acc, row_max, row_sum = _talking_piece(
                acc, row_max, row_sum, query_at, tile_mask, program, operands, pairs, mix_values, sizes, scales,
                dropout, piece, HEADS, BLOCK_M, BLOCK_N, WINDOWED, HAS_RELATIVE, HAS_CARRIED, WRITE_SUMMED, DROPOUT,
                statistics_pass == 0, PRECISION)

    tl.store(head_rows(context, batch, head, tile.rows[:, None]) + tile.dims[None, :],
             acc.to(context.data.dtype.element_ty), mask=tile_mask)
    stats, stats_mask = head_statistics(batch, sizes, tile, HEADS)  # [HEADS, M]
    tl.store(statistics.row_max + stats, row_max, mask=stats_mask)
    tl.store(statistics.row_sum + stats, row_sum, mask=stats_mask)
