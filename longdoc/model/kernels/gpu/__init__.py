"""The fused GPU attention: each softmax of the global-local attention in Triton kernels, forward
and backward (`run_forward`, `run_backward`: the gpu backend's autograd function calls them,
longdoc.model.backends.gpu).

One softmax, as the eager backend specifies it (longdoc.model.backends.eager): queries q [B, h,
Nq, d] over a row of N keys, [first piece | second piece]. The first piece is the queries' own keys:
with a window of blocks of b queries (the long softmax), block i's 3b keys (i - 1) b .. (i + 2) b -
1, zero outside the input; otherwise all of them (the global softmax). The second is every key of
the other stream (or of a cross projection). Per pair:

    summed  = q.k / sqrt(d) + relative[ids] + carried      (written: residual attention's carry)
    weights = post @ softmax(scale * (pre @ summed) + mask)  (pre, post: talking heads' mixes)
    context = dropout(weights) @ values

The kernels (forward.py, backward.py; shared tiles in tiles.py; the named records they take and
pass between their helpers in records.py):
- attention_forward: a program per (batch x head, tile of queries), heads of a tile side by side so
  that the ids and mask rows they share come from the cache. A windowed softmax's tiles each hold
  queries of one block (a block of 85 queries: three tiles of 32), which share their window: the
  tile walks exactly its 3b keys, whose columns in the rows are those of the keys, so each row of
  scores is read and written in contiguous runs and no pair outside the window is computed. Then
  the second piece's keys, in tiles of keys, with the online softmax of flash attention (two to
  four key tiles a piece at ETC's sizes): q.k on the tensor cores, the relative term gathered from
  the row's R terms by the pair's id, the carried score added, the sum stored, the logits kept in
  base 2 (log2(e) folded into the scale and the mask, the numerators exp2 of their differences), the
  running max and sum updated, the weights' tile times the values accumulated. Nothing [Nq, N] is
  written but the summed scores, and only when they are carried.
- talking_heads_forward: the heads are mixed per pair, so a program holds a tile of queries of all
  heads ([h, 16, 16] tiles of scores; h padded to a power of two). It reads one
  head's queries, keys and values ([16, d] tiles) at a time: each head's summed scores, computed
  and written alone, are added times that head's column of pre to the mixed scores of all heads;
  the weights of a head are its row of post times the normalised weights of all, and multiply its
  values alone. Two passes over the keys: the row statistics of the mixed logits, then the
  weights and the context. No [h, 16, d] tile is live but the context's accumulator, so its
  sm_90 builds keep their values in registers (the backward adds the queries' gradient
  atomically, as the keys', rather than holding an accumulator of all heads).
- the backwards recompute the weights from the rows' saved max and sum (flash attention's
  recomputation: a [B, h, Nq, N] tensor of weights would be the largest thing in memory, read
  back once), and the summed scores from q, k and the terms, or, with residual attention, read
  them where the forward wrote them (the next layer keeps them anyway, as its carried scores; the
  forward's softmax reads them as stored, rounded to their dtype, as the eager path and the next
  layer do). Per tile they write the gradient of the summed scores (that of the carried scores,
  and of the picked relative terms: backends.relative.relative_gradient sums it by the ids' structure),
  store the queries' gradient (a program holds all of its queries' keys) and add the keys' and
  values' atomically (float32): the windows of neighbouring tiles overlap and every query reads the
  second piece. Without talking heads each row's delta = sum(weights * their gradient) is
  sum(grad_context * context), computed before the kernel; with them it takes a first pass.
- dropout: Philox keyed on a seed from torch's generator and counted by the weight's place, so the
  backward draws the same mask again instead of storing one.

Tiles (softmax.tiles_for): 32 queries x 64 keys (bfloat16, float16 at head sizes up to 64; 32 keys
otherwise) where a softmax has enough of them, 16 (the least a tl.dot takes) otherwise; talking heads
16 x 16 pairs of all heads, padded to a power of two. Head sizes are padded to a power of two of at least 16.
Small problems (the tests') follow the same rules as real ones, so Triton's interpreter runs the
code the GPU compiles; tests/model/gpu_kernel_builds.py builds them for an H100 (sm_90) with
Triton's compiler, which checks what the interpreter cannot (valid GPU programs, shared memory per
block) and their registers: no build without talking heads in bfloat16 or float16 spills. Operands in
bfloat16, float16 or float32, read in place (q, k, v where the projection wrote them; the context
where the output projection reads it); everything is accumulated in float32, and float32 operands
multiply exactly (no TF32: as torch's matmul by default).

Expected costs on an H100 (estimates): per pair and head the forward does 2d
multiply-adds on the tensor cores (q.k, weights @ v: 256 flops at d = 64) and one exponential, and
with residual attention in bfloat16 moves about 4.5 bytes (the carried score read, the sum written,
and the pair's id and mask, 6 bytes shared by h = 12 heads): about 57 flops a byte, well below the
~300 at which the H100 (990 TFLOPS, 3.35 TB/s) stops waiting on memory. So the long softmax should
be bound by the traffic of the carried scores, as the C++ kernel is on CPU (the backward reads the
summed scores and the gradient carried back and writes the summed scores' gradient: about 6.5
bytes for 10d multiply-adds); without residual attention it is bound like flash attention at
d = 64, by the exponentials and the tensor cores together. Talking heads add 2h multiply-adds per
pair and head for the mixes and read each head's operands apart: expect them to be the slowest.
Measured on an H200 (docs/benchmarks.md, "On a GPU") before the tiles of blocks and 64 keys, they
moved the traffic above far below the memory's rate and were slower than the eager backend without
talking heads; docs/gpu/kernel.md says what the present design should move and how the device
check measures it.
"""

from longdoc.model.kernels.gpu.softmax import (
    HeadGradients, ScoreGradients, SoftmaxTensors, dropout_for, interpreter_failure, interpreting, run_backward,
    run_forward, triton_available, triton_failure,
)

__all__ = ["HeadGradients", "ScoreGradients", "SoftmaxTensors", "dropout_for", "interpreter_failure", "interpreting",
           "run_backward", "run_forward", "triton_available", "triton_failure"]
