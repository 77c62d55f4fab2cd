// Global-local attention's compiled CPU kernels (float32): each softmax of a layer whole, from the
// projections to the context, forward and backward. This header holds what the forward
// (forward.cpp) and the backward (backward.cpp) share: the operands (one record per direction,
// below), their shapes and checks, the keys' pieces and chunks, the compact rows of hard g2l, and
// dropout; the products are in products.h, and binding.cpp binds the four entry points at the end
// to Python, each taking its record's fields by name.
//
// Eager PyTorch writes a [B, h, M, N] tensor of scores (25M floats for the long softmax at 4096
// tokens) and makes a round trip through memory for each step on it: the window keys' copy, the
// q.k matmul, the gathered relative terms and their add, the carried scores' add, the mask, the
// softmax, the matmul with the values. Here a task holds a chunk of queries (a block of b long
// queries and its window of 3b long keys, or 128 global queries) of one head and does it all in a
// buffer that stays in the core's cache:
//
//   scores  = alpha q.k                            two small GEMMs: [first keys | second keys]
//   summed  = scores + relative[ids] + carried     (kept: carried to the next layer)
//   probs   = softmax(scale * summed + mask)       (kept for the backward, with autograd)
//   context = dropout(probs) @ values              two small GEMMs
//
// so only the carried sums, and in training the weights, go to memory. q, k and v are read where
// the QKV projection wrote them ([B, N, 3, h, d]) and the context is written where the output
// projection reads it. relative [B, h, M, R]; ids (int32) and the mask [B, M, N], shared by the
// heads. The backward recomputes nothing: from the kept weights, per (batch, head), the
// gradients of the weights, the scores (written: they are also those of the relative terms and
// the carried sums) and of q, k and v (added to). With talking heads a task holds all heads of
// its chunk, whose scores are mixed across heads before the softmax and after it.

#pragma once

#include <ATen/ATen.h>

#include "products.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

namespace longdoc::attention {

inline const float* data_or_null(const c10::optional<at::Tensor>& tensor) {
  return tensor.has_value() ? tensor->data_ptr<float>() : nullptr;
}

inline void check(const at::Tensor& tensor, const char* name, at::ScalarType dtype, int64_t dims) {
  TORCH_CHECK(tensor.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(tensor.scalar_type() == dtype, name, " must be ", dtype, ", not ", tensor.scalar_type());
  TORCH_CHECK(tensor.dim() == dims, name, " must have ", dims, " dimensions, not ", tensor.dim());
  TORCH_CHECK(tensor.is_contiguous(), name, " must be contiguous");
}

// A [B, h, N, d] operand in place at its strides (rows of d contiguous floats): q, k, v as the
// projection wrote them ([B, N, 3, h, d]), the context and the gradients as the next op reads them.
template <typename Float>
struct Rows {
  Float* data;
  int64_t batch_stride, head_stride, row_stride;

  explicit Rows(const at::Tensor& tensor)
      : data(tensor.data_ptr<float>()), batch_stride(tensor.stride(0)), head_stride(tensor.stride(1)),
        row_stride(tensor.stride(2)) {}

  Rows(Float* data, int64_t batch_stride, int64_t head_stride, int64_t row_stride)
      : data(data), batch_stride(batch_stride), head_stride(head_stride), row_stride(row_stride) {}

  Float* at(int64_t batch, int64_t head, int64_t row) const {
    return data + batch * batch_stride + head * head_stride + row * row_stride;
  }
};

// The two pieces of keys of one softmax. The first: with `window_block` b, query block i's window,
// long keys (i - 1) b .. (i + 2) b, of which those outside [0, N1) are the eager path's zero
// padding (score 0, value 0: their columns are skipped by the GEMMs); with window_block 0, all N1
// keys. The second: all N2 keys. A row of scores is [first piece | second piece].
struct Pieces {
  int64_t window_block, first_rows, second_rows, first_width, width;

  Pieces(int64_t window_block, int64_t first_rows, int64_t second_rows)
      : window_block(window_block), first_rows(first_rows), second_rows(second_rows),
        first_width(window_block > 0 ? 3 * window_block : first_rows), width(first_width + second_rows) {}

  // Queries a task holds: a block of the window, else up to 128 global queries (fewer chunks read
  // the long keys and values fewer times: each chunk's GEMMs read them all; 128 measured faster
  // than 32), so that a chunk's scores stay in a core's cache between the GEMMs and the row pass.
  // With talking heads a task holds all heads: at most 2^21 floats (8 MB) of scores (40 rows at
  // 12 heads x 4352 keys; measured faster than chunks of 10 rows in 2 MB).
  int64_t chunk(int64_t heads_together = 1) const {
    if (window_block > 0) return window_block;
    return std::max<int64_t>(1, std::min<int64_t>(128, (int64_t{1} << 21) / (heads_together * width)));
  }

  // The first piece's real keys for the chunk starting at query `first`: [begin, end), in columns from `column`.
  struct Span { int64_t begin, end, column; };
  Span keys_of(int64_t first) const {
    if (window_block == 0) return {0, first_rows, 0};
    const int64_t start = first - window_block;
    const int64_t begin = std::max<int64_t>(start, 0), end = std::min<int64_t>(start + first_width, first_rows);
    return {begin, end, begin - start};
  }

  // Zero the columns of the first piece that hold no real key, in `count` rows of `buffer` (rows
  // `stride` apart; default: the width).
  void zero_padding(const Span& span, int64_t count, float* buffer, int64_t stride = 0) const {
    stride = stride > 0 ? stride : width;
    for (int64_t i = 0; i < count; ++i) {
      std::fill(buffer + i * stride, buffer + i * stride + span.column, 0.0f);
      std::fill(buffer + i * stride + span.column + (span.end - span.begin), buffer + i * stride + first_width, 0.0f);
    }
  }
};

// Talking heads' tasks: a chunk of queries of all heads at once.
struct Chunks {
  const Pieces& pieces;
  int64_t queries, rows, count;

  Chunks(const Pieces& pieces, int64_t heads, int64_t queries, int64_t most)
      : pieces(pieces), queries(queries), rows(std::min(pieces.chunk(heads), most)),
        count((queries + rows - 1) / rows) {}

  struct Task { int64_t first, count; Pieces::Span span; };
  Task at(int64_t index) const {
    const int64_t first = index * rows;
    return {first, std::min(rows, queries - first), pieces.keys_of(first)};
  }
};

inline void check_rows(const at::Tensor& tensor, const char* name, const at::Tensor& query) {
  TORCH_CHECK(tensor.device().is_cpu() && tensor.scalar_type() == at::kFloat, name, " must be CPU float32, not ",
              tensor.device(), " ", tensor.scalar_type());
  TORCH_CHECK(tensor.dim() == 4 && tensor.size(0) == query.size(0) && tensor.size(1) == query.size(1) &&
              tensor.size(3) == query.size(3), name, " must be [B, h, N, d] like the query ", query.sizes(),
              ", not ", tensor.sizes());
  TORCH_CHECK(tensor.stride(3) == 1, name, "'s rows must be contiguous");
}

// Values as long as their keys: each piece's, [B, h, N1 | N2, d].
inline void check_values(const at::Tensor& first_keys, const at::Tensor& first_values, const at::Tensor& second_keys,
                         const at::Tensor& second_values) {
  TORCH_CHECK(first_values.size(2) == first_keys.size(2) && second_values.size(2) == second_keys.size(2),
              "keys and values differ in length: first_keys ", first_keys.sizes(), ", first_values ",
              first_values.sizes(), ", second_keys ", second_keys.sizes(), ", second_values ", second_values.sizes());
}

// A head mix (talking heads' pre or post, or its gradient): [h, h].
inline void check_mix(const at::Tensor& mix, const char* name, int64_t heads) {
  check(mix, name, at::kFloat, 2);
  TORCH_CHECK(mix.size(0) == heads && mix.size(1) == heads, name, " must be [h, h] with h = ", heads, ", not ",
              mix.sizes());
}

// A [B, h, M, N] tensor of scores, N = `width` keys, if given.
inline void check_scores(const c10::optional<at::Tensor>& tensor, const char* name, const at::Tensor& query,
                         int64_t width, at::ScalarType dtype = at::kFloat) {
  if (!tensor.has_value()) return;
  check(*tensor, name, dtype, 4);
  const std::vector<int64_t> expected{query.size(0), query.size(1), query.size(2), width};
  TORCH_CHECK(tensor->sizes() == at::IntArrayRef(expected), name, " must be [B, h, M, N] = ", at::IntArrayRef(expected),
              ", not ", tensor->sizes());
}

// Global queries a task holds when ranges narrow their keys: a chunk's keys are the union of its
// rows' ranges, so chunks of a few consecutive sentences stay narrow (16 rows: the fastest of 16,
// 32, 64 and 128 at 4096 tokens and 256 sentences).
constexpr int64_t kChunkWithRanges = 16;

// Hard g2l: a sentence's global token sees its own long tokens only, so most of a global row's
// second piece is masked (15 of 16 columns at 4096 tokens and 256 sentences). `key_ranges` [B, M, 2]
// gives the second keys [low, high) each query may see; a chunk computes the union of its rows'
// ranges and skips the rest, whose weights are exactly 0 (their mask underflows exp). Its rows'
// used columns, [first piece | second keys low .. high), are gathered into one run for the row
// pass, which then needs no gaps; what it writes goes back to the full rows, only where computed
// (the weights kept for autograd and the summed scores: the skipped columns are masked in every
// layer, and neither the next layer nor the backward reads them). The backwards take the same
// chunks of queries as the forwards, so they read exactly the columns the forward wrote; their
// gradient of the scores in the skipped columns is the one carried back from the next layer (0
// without), as no weight reached them.
inline std::pair<int64_t, int64_t> chunk_range(const int32_t* ranges, int64_t count) {
  int64_t low = std::numeric_limits<int64_t>::max(), high = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (ranges[2 * i] >= ranges[2 * i + 1]) continue;  // a row that sees no second key
    low = std::min<int64_t>(low, ranges[2 * i]);
    high = std::max<int64_t>(high, ranges[2 * i + 1]);
  }
  return low < high ? std::pair<int64_t, int64_t>{low, high} : std::pair<int64_t, int64_t>{0, 0};
}

// key_ranges [B, M, 2] int32 (see chunk_range), or null without.
inline const int32_t* checked_ranges(const c10::optional<at::Tensor>& key_ranges, int64_t batch, int64_t rows,
                                     int64_t window_block) {
  if (!key_ranges.has_value()) return nullptr;
  check(*key_ranges, "key_ranges", at::kInt, 3);
  TORCH_CHECK(key_ranges->sizes() == at::IntArrayRef({batch, rows, 2}), "key_ranges must be [B, M, 2] = [", batch,
              ", ", rows, ", 2], not ", key_ranges->sizes());
  TORCH_CHECK(window_block == 0, "key_ranges narrow the keys of global queries only");
  return key_ranges->data_ptr<int32_t>();
}

struct CompactRow {
  struct Layout {
    int64_t first_width, low, high;

    int64_t used() const { return first_width + high - low; }

    template <typename T>
    void gather(const T* full, T* out) const {
      std::copy(full, full + first_width, out);
      std::copy(full + first_width + low, full + first_width + high, out + first_width);
    }
    // `count` rows `width` apart gathered into rows of used() columns at `buffer` (null stays null).
    template <typename T>
    const T* gather_rows(const T* full, int64_t count, int64_t width, T* buffer) const {
      if (full == nullptr) return nullptr;
      for (int64_t i = 0; i < count; ++i) gather(full + i * width, buffer + i * used());
      return buffer;
    }
    void scatter(const float* compact, float* full) const {
      std::copy(compact, compact + first_width, full);
      std::copy(compact + first_width, compact + first_width + high - low, full + first_width + low);
    }
    void scatter_with_zeros(const float* compact, float* full, int64_t width) const {
      scatter(compact, full);
      std::fill(full + first_width, full + first_width + low, 0.0f);
      std::fill(full + first_width + high, full + width, 0.0f);
    }
    // A row's gradient of the summed scores: in the skipped columns (no weight) only the gradient
    // carried back from the next layer passes (0 without).
    void scatter_gradient(const float* compact, const float* carried_grad, float* full, int64_t width) const {
      if (!carried_grad) return scatter_with_zeros(compact, full, width);
      std::memcpy(full, carried_grad, width * sizeof(float));
      scatter(compact, full);
    }
  };

  std::vector<float> carried, mask, summed;
  std::vector<int32_t> ids;
  std::vector<uint8_t> keep;

  explicit CompactRow(int64_t width) : carried(width), mask(width), summed(width), ids(width), keep(width) {}

  template <typename T>
  const T* gather(const Layout& layout, const T* full, std::vector<T>& buffer) const {
    return layout.gather_rows(full, 1, 0, buffer.data());
  }
};

// Dropout in place on n values: kept ones scaled by keep_scale, the others 0.
inline void apply_keep(const uint8_t* __restrict keep, float keep_scale, int64_t n, float* __restrict values) {
#pragma omp simd
  for (int64_t e = 0; e < n; ++e) values[e] = keep[e] ? values[e] * keep_scale : 0.0f;
}

// Dropped weights for the values: probs * keep * keep_scale.
inline void drop(const float* __restrict probs, const uint8_t* __restrict keep, float keep_scale, int64_t width,
                 float* __restrict dropped) {
#pragma omp simd
  for (int64_t c = 0; c < width; ++c) dropped[c] = keep[c] ? probs[c] * keep_scale : 0.0f;
}

// The keys of the chunk of `count` queries from `first` in batch entry `b`: the first piece's real
// keys (`span`) and the second keys it computes (`layout`: all of them, or with key ranges the
// union of its rows' ranges; `gaps` when that leaves some out).
struct ChunkKeys {
  int64_t first, count;
  Pieces::Span span;
  CompactRow::Layout layout;
  bool gaps;

  ChunkKeys(const Pieces& pieces, const int32_t* ranges, int64_t rows, int64_t b, int64_t first, int64_t count)
      : first(first), count(count), span(pieces.keys_of(first)), layout{pieces.first_width, 0, pieces.second_rows},
        gaps(false) {
    if (ranges) std::tie(layout.low, layout.high) = chunk_range(ranges + 2 * (b * rows + first), count);
    gaps = layout.high - layout.low < pieces.second_rows;
  }

  int64_t used() const { return layout.used(); }  // a row's columns
  int64_t first_keys() const { return span.end - span.begin; }
  int64_t second_keys() const { return layout.high - layout.low; }
};

// out [count, used] = alpha * rows [count, d] @ [the chunk's first keys | its second keys]^T, the
// first piece's columns without a real key zeroed: the chunk's scores (keys: the keys), or the
// gradient of its weights (rows: the context's gradient, keys: the values).
inline void products_with_keys(const Pieces& pieces, const ChunkKeys& chunk, int64_t size, float alpha,
                               const float* rows, int64_t row_stride, const float* first_keys, int64_t first_stride,
                               const float* second_keys, int64_t second_stride, float* out) {
  const int64_t used = chunk.used();
  pieces.zero_padding(chunk.span, chunk.count, out, used);
  gemm(false, true, chunk.count, chunk.first_keys(), size, alpha, rows, row_stride, first_keys, first_stride, 0.0f,
       out + chunk.span.column, used);
  gemm(false, true, chunk.count, chunk.second_keys(), size, alpha, rows, row_stride, second_keys, second_stride, 0.0f,
       out + pieces.first_width, used);
}

// out [count, d] = weights [count, .. stride] @ [the chunk's first values | its second values].
inline void weighted_values(const Pieces& pieces, const ChunkKeys& chunk, int64_t size, const float* weights,
                            int64_t stride, const float* first_values, int64_t first_stride,
                            const float* second_values, int64_t second_stride, float* out, int64_t out_stride) {
  gemm(false, false, chunk.count, size, chunk.first_keys(), 1.0f, weights + chunk.span.column, stride, first_values,
       first_stride, 0.0f, out, out_stride);
  gemm(false, false, chunk.count, size, chunk.second_keys(), 1.0f, weights + pieces.first_width, stride,
       second_values, second_stride, 1.0f, out, out_stride);
}

// What a softmax's forward and its backward both take, by name from Python: query [B, h, M, d]
// (unscaled: query_scale multiplies q.k); keys and values [B, h, N1 | N2, d] (with window_block b > 0,
// the first keys of query block i are the window (i - 1) b .. (i + 2) b; with 0, all of them): all at
// their strides, rows contiguous. scale multiplies the summed scores in the softmax (the running
// mean's); keep (uint8 [B, h, M, N], contiguous: dropout's mask) and keep_scale, which multiplies the
// kept weights; pre and post [h, h]: talking heads' mixes (talking_heads_* only); key_ranges
// [B, M, 2] int32: see chunk_range.
struct SoftmaxOperands {
  at::Tensor query;
  double query_scale = 1.0;
  at::Tensor first_keys, first_values;
  int64_t window_block = 0;
  at::Tensor second_keys, second_values;
  double scale = 1.0;
  c10::optional<at::Tensor> keep;
  double keep_scale = 1.0;
  c10::optional<at::Tensor> pre, post;
  c10::optional<at::Tensor> key_ranges;
};

// What a forward takes besides (attention_forward, talking_heads_forward): relative [B, h, M, R];
// ids (int32) and mask_bias [B, M, N], shared by the heads; carried, summed_out and probs_out (the
// weights autograd keeps, before dropout; keep comes with it): [B, h, M, N], contiguous; summed_out
// may be carried; context_out [B, h, M, d] at its strides, rows contiguous.
struct ForwardOperands : SoftmaxOperands {
  c10::optional<at::Tensor> relative, ids, carried;
  at::Tensor mask_bias;
  c10::optional<at::Tensor> summed_out, probs_out;
  at::Tensor context_out;
};

// What a backward takes besides (attention_backward, talking_heads_backward): probs, the weights
// its forward kept, and (talking heads) summed, the summed scores; grad_context [B, h, M, d] and
// grad_summed [B, h, M, N] (that of the summed scores carried on, if any). Written: grad_scores_out
// [B, h, M, N]; added to: grad_query, grad_first_keys, grad_first_values, grad_second_keys,
// grad_second_values (shaped as their inputs) and (talking heads) grad_pre, grad_post.
struct BackwardOperands : SoftmaxOperands {
  at::Tensor probs;
  c10::optional<at::Tensor> summed;
  at::Tensor grad_context;
  c10::optional<at::Tensor> grad_summed;
  at::Tensor grad_scores_out;
  c10::optional<at::Tensor> grad_pre, grad_post;
  at::Tensor grad_query, grad_first_keys, grad_first_values, grad_second_keys, grad_second_values;
};

// The entry points (see their definitions for what they compute); each checks its operands and says
// which one is wrong.
void attention_forward(const ForwardOperands& operands);
void talking_heads_forward(const ForwardOperands& operands);
void attention_backward(const BackwardOperands& operands);
void talking_heads_backward(const BackwardOperands& operands);

}  // namespace longdoc::attention
