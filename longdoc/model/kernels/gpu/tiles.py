"""Triton building blocks of the GPU attention's forward and backward kernels (see
longdoc.model.kernels.gpu): which pairs a tile of queries and keys holds, the summed scores of a
tile, the online softmax's step and dropout's keep decision.

They work on tiles of any rank: [M, N] (one head's queries and keys) or [h, M, N] (all heads of
the queries, talking heads), reducing over the last axis. Imported only when a kernel runs (it
imports triton).
"""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
# The running maximum of a row starts below every logit a row can have (a masked one is about
# -1.7e38: half float32's or bfloat16's minimum, plus a score), so that a tile holding none of the
# row's pairs (their logits are -inf) leaves it as it is and adds exp2(-inf) = 0; and far enough
# from float32's limit (3.4e38) that (maximum - logit) * log2(e) stays finite.
INITIAL_MAX = tl.constexpr(-2.0e38)


@triton.jit
def piece_key_range(row_start, num_queries, window, num_keys, BLOCK_M: tl.constexpr, WINDOWED: tl.constexpr):
    """The keys [low, high) a tile of queries from `row_start` reads in one piece: with a window of
    blocks of `window` queries, from the block before its first query's to the block after its last
    one's (beyond [0, num_keys) is the window's zero padding); otherwise all `num_keys`."""
    if WINDOWED:
        last = tl.minimum(row_start + BLOCK_M, num_queries) - 1
        low = (row_start // window - 1) * window
        high = (last // window + 2) * window
    else:
        low = 0
        high = num_keys
    return low, high


@triton.jit
def pair_tile(start, rows, row_ok, window, column_offset, first_width, num_keys, ids, mask, BLOCK_N: tl.constexpr,
              WINDOWED: tl.constexpr, HAS_RELATIVE: tl.constexpr):
    """The tile of BLOCK_N keys of one piece from `start` and its pairs with `rows` [M]: the keys [N]
    and which exist; the pairs' columns in the rows of scores (first piece, then second) and which
    are pairs of the softmax, their relative ids (if HAS_RELATIVE, else the columns) and their mask
    bias (float32), all [M, N]. `ids`, `mask`: pointers to the rows' first elements [M, 1].
    Windowed, query p of block i has columns 0..3b-1 for keys (i - 1) b .. (i + 2) b - 1 (those
    outside [0, num_keys) are the zero padding); otherwise key j has column `column_offset` + j (0
    for the first piece, its width for the second)."""
    keys = start + tl.arange(0, BLOCK_N)
    key_ok = (keys >= 0) & (keys < num_keys)
    if WINDOWED:
        columns = keys[None, :] - (rows[:, None] // window - 1) * window
        valid = (columns >= 0) & (columns < first_width) & row_ok[:, None]
    else:
        columns = column_offset + keys[None, :] + 0 * rows[:, None]
        valid = key_ok[None, :] & row_ok[:, None]
    pair_ids = columns
    if HAS_RELATIVE:
        pair_ids = tl.load(ids + columns, mask=valid, other=0)
    mask_bias = tl.load(mask + columns, mask=valid, other=0.0).to(tl.float32)
    return keys, key_ok, columns, valid, pair_ids, mask_bias


@triton.jit
def summed_scores(query, keys, query_scale, ids, relative_rows, carried_at, valid, HAS_RELATIVE: tl.constexpr,
                  HAS_CARRIED: tl.constexpr, PRECISION: tl.constexpr):
    """query_scale q.k + relative[ids] + carried, in float32 ([.., M, D] x [.., N, D] -> [.., M, N]).
    `ids` [M, N] (loaded: the heads share them), `relative_rows` pointers to each row's relative
    terms ([.., M, 1]), `carried_at` pointers to the carried scores of the pairs."""
    summed = tl.dot(query, tl.trans(keys), input_precision=PRECISION) * query_scale
    if HAS_RELATIVE:
        summed += tl.load(relative_rows + ids, mask=valid, other=0.0).to(tl.float32)
    if HAS_CARRIED:
        summed += tl.load(carried_at, mask=valid, other=0.0).to(tl.float32)
    return summed


@triton.jit
def saved_or_summed_scores(query, keys, query_scale, ids, relative_rows, carried_at, summed_at, valid,
                           HAS_RELATIVE: tl.constexpr, HAS_CARRIED: tl.constexpr, SUMMED_SAVED: tl.constexpr,
                           PRECISION: tl.constexpr):
    """The backward's summed scores of a tile: read at `summed_at` where the forward wrote them
    (SUMMED_SAVED: residual attention), else computed again (summed_scores)."""
    if SUMMED_SAVED:
        scores = tl.load(summed_at, mask=valid, other=0.0).to(tl.float32)
    else:
        scores = summed_scores(query, keys, query_scale, ids, relative_rows, carried_at, valid, HAS_RELATIVE,
                               HAS_CARRIED, PRECISION)
    return scores


@triton.jit
def masked_logits(scores, mask_bias, valid, scale):
    """The softmax's input scale * scores + mask_bias, -inf outside the rows' pairs (no weight)."""
    return tl.where(valid, scale * scores + mask_bias, float("-inf"))


@triton.jit
def online_softmax_step(logits, row_max, row_sum):
    """One tile of the online softmax over the last axis: (its numerators exp(logits - new max),
    the correction exp(old max - new max) of what was accumulated, the new max, the new sum)."""
    new_max = tl.maximum(row_max, tl.max(logits, -1))
    correction = tl.exp2((row_max - new_max) * LOG2E)
    numerators = tl.exp2((logits - tl.expand_dims(new_max, -1)) * LOG2E)
    return numerators, correction, new_max, row_sum * correction + tl.sum(numerators, -1)


@triton.jit
def normalized_weights(logits, row_max, row_sum):
    """The softmax's weights of a tile from the statistics of its rows (max, sum of numerators; a sum
    of 0 is a row past the queries' end, without pairs)."""
    numerators = tl.exp2((logits - tl.expand_dims(row_max, -1)) * LOG2E)
    return numerators / tl.expand_dims(tl.where(row_sum > 0, row_sum, 1.0), -1)


@triton.jit
def dropped(values, seed, stream, element, drop_threshold, keep_scale):
    """Dropout of `values`: kept ones times keep_scale, the others 0. The decision for an element of
    the weights is Philox (seed; counters: `element`, its place in its head's [Nq, N] rows, and
    `stream`, batch * heads + head): 24 uniform bits, kept when at least drop_threshold (the drop
    probability times 2^24), so the forward and the backward draw the same mask without storing it."""
    bits, _, _, _ = tl.philox(seed, element, stream, 0, 0)
    kept = (bits >> 8).to(tl.int32) >= drop_threshold
    return tl.where(kept, values * keep_scale, 0.0)


@triton.jit
def mix_heads(mixing, values, HEADS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              PRECISION: tl.constexpr):
    """Talking heads' mix of [HEADS, M, N] across heads: mixing [HEADS_out, HEADS_in] @ values, one
    GEMM over the tile's pairs."""
    flat = tl.reshape(values, (HEADS, BLOCK_M * BLOCK_N))
    return tl.reshape(tl.dot(mixing, flat, input_precision=PRECISION), (HEADS, BLOCK_M, BLOCK_N))


@triton.jit
def keep_mask_kernel(keep, seed, num_streams, elements, drop_threshold, BLOCK: tl.constexpr):
    """keep [streams, elements] (uint8): 1 where `dropped` keeps the element (for checks)."""
    stream = tl.program_id(1)
    element = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    kept = dropped(tl.full((BLOCK,), 1.0, tl.float32), seed, stream, element, drop_threshold, 1.0)
    tl.store(keep + stream.to(tl.int64) * elements + element, kept.to(tl.uint8), mask=element < elements)
