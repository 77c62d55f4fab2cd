// The backward of one softmax of global-local attention (see attention.h): attention_backward, and
// talking_heads_backward with the gradients of the heads' mixes.

#include <ATen/Parallel.h>

#include <mutex>
#include <tuple>

#include "attention.h"
#include "products.h"

namespace longdoc::attention {
namespace {

// A backward's operands (BackwardOperands, attention.h), checked: row views of the [B, h, N, d]
// tensors (the gradients' too), pointers to the others (null where not given), the scalars as floats.
struct CheckedBackward {
  Rows<const float> q, k1, v1, k2, v2, grad_out;
  Rows<float> dq, dk1, dv1, dk2, dv2;
  int64_t batch, heads, rows, size;
  Pieces pieces;
  float alpha, factor, dropped_scale;  // query_scale, scale, keep_scale
  const float* probs;
  const uint8_t* keep;
  const float* grad_summed;
  float* grad_scores;
  const int32_t* ranges;

  // The first and second keys (or values, or their gradients) of the chunk `keys`.
  template <typename Float>
  static Float* first_of(const Rows<Float>& rows, const ChunkKeys& keys, int64_t b, int64_t head) {
    return rows.at(b, head, keys.span.begin);
  }
  template <typename Float>
  static Float* second_of(const Rows<Float>& rows, const ChunkKeys& keys, int64_t b, int64_t head) {
    return rows.at(b, head, keys.layout.low);
  }
  // g [count, used] = grad_context @ [the chunk's first values | second values]^T: the gradient of its
  // (dropped) weights.
  void grad_weights(const ChunkKeys& keys, int64_t b, int64_t head, float* g) const {
    products_with_keys(pieces, keys, size, 1.0f, grad_out.at(b, head, keys.first), grad_out.row_stride,
                       first_of(v1, keys, b, head), v1.row_stride, second_of(v2, keys, b, head), v2.row_stride, g);
  }
};

// `operands` checked: [B, h, N, d] like the query, rows contiguous, each gradient shaped like its
// input; probs, keep, grad_summed and grad_scores_out [B, h, M, N].
CheckedBackward checked_backward(const BackwardOperands& o) {
  for (const auto& [tensor, name] : {std::pair{&o.first_keys, "first_keys"}, {&o.first_values, "first_values"},
                                     {&o.second_keys, "second_keys"}, {&o.second_values, "second_values"},
                                     {&o.grad_context, "grad_context"}, {&o.grad_query, "grad_query"},
                                     {&o.grad_first_keys, "grad_first_keys"}, {&o.grad_first_values, "grad_first_values"},
                                     {&o.grad_second_keys, "grad_second_keys"},
                                     {&o.grad_second_values, "grad_second_values"}}) {
    check_rows(*tensor, name, o.query);
  }
  check_rows(o.query, "query", o.query);
  check_values(o.first_keys, o.first_values, o.second_keys, o.second_values);
  for (const auto& [grad, input, name] :
       {std::tuple{&o.grad_context, &o.query, "grad_context"}, {&o.grad_query, &o.query, "grad_query"},
        {&o.grad_first_keys, &o.first_keys, "grad_first_keys"}, {&o.grad_first_values, &o.first_values, "grad_first_values"},
        {&o.grad_second_keys, &o.second_keys, "grad_second_keys"},
        {&o.grad_second_values, &o.second_values, "grad_second_values"}}) {
    TORCH_CHECK(grad->sizes() == input->sizes(), name, " must be shaped like its input ", input->sizes(), ", not ",
                grad->sizes());
  }
  const Pieces pieces(o.window_block, o.first_keys.size(2), o.second_keys.size(2));
  check_scores(o.probs, "probs", o.query, pieces.width);
  check_scores(o.keep, "keep", o.query, pieces.width, at::kByte);
  check_scores(o.grad_summed, "grad_summed", o.query, pieces.width);
  check_scores(o.grad_scores_out, "grad_scores_out", o.query, pieces.width);
  const int64_t batch = o.query.size(0), rows = o.query.size(2);
  return CheckedBackward{
      Rows<const float>(o.query), Rows<const float>(o.first_keys), Rows<const float>(o.first_values),
      Rows<const float>(o.second_keys), Rows<const float>(o.second_values), Rows<const float>(o.grad_context),
      Rows<float>(o.grad_query), Rows<float>(o.grad_first_keys), Rows<float>(o.grad_first_values),
      Rows<float>(o.grad_second_keys), Rows<float>(o.grad_second_values), batch, o.query.size(1), rows,
      o.query.size(3), pieces, static_cast<float>(o.query_scale), static_cast<float>(o.scale),
      static_cast<float>(o.keep_scale), o.probs.data_ptr<float>(), o.keep.has_value() ? o.keep->data_ptr<uint8_t>() : nullptr,
      data_or_null(o.grad_summed), o.grad_scores_out.data_ptr<float>(),
      checked_ranges(o.key_ranges, batch, rows, o.window_block)};
}

// For the chunk `keys` of head `head` in entry `b`: from g, the gradient of its scores, and the
// weights that multiplied the values (rows of the chunk's used columns): dq += alpha g k,
// dk += alpha g^T q, dv += weights^T grad_out, over both pieces.
void add_chunk_gradients(const CheckedBackward& o, const ChunkKeys& keys, int64_t b, int64_t head, const float* g,
                         const float* weights) {
  const int64_t used = keys.used(), d = o.size, count = keys.count, column = keys.span.column;
  const int64_t real_keys = keys.first_keys(), second = keys.second_keys(), at = keys.layout.first_width;
  const float alpha = o.alpha;
  const float* query_rows = o.q.at(b, head, keys.first);
  const float* grad_rows = o.grad_out.at(b, head, keys.first);
  float* dq = o.dq.at(b, head, keys.first);
  gemm(false, false, count, d, real_keys, alpha, g + column, used, o.first_of(o.k1, keys, b, head), o.k1.row_stride,
       1.0f, dq, o.dq.row_stride);
  gemm(false, false, count, d, second, alpha, g + at, used, o.second_of(o.k2, keys, b, head), o.k2.row_stride, 1.0f,
       dq, o.dq.row_stride);
  gemm(true, false, real_keys, d, count, alpha, g + column, used, query_rows, o.q.row_stride, 1.0f,
       o.first_of(o.dk1, keys, b, head), o.dk1.row_stride);
  gemm(true, false, second, d, count, alpha, g + at, used, query_rows, o.q.row_stride, 1.0f,
       o.second_of(o.dk2, keys, b, head), o.dk2.row_stride);
  gemm(true, false, real_keys, d, count, 1.0f, weights + column, used, grad_rows, o.grad_out.row_stride, 1.0f,
       o.first_of(o.dv1, keys, b, head), o.dv1.row_stride);
  gemm(true, false, second, d, count, 1.0f, weights + at, used, grad_rows, o.grad_out.row_stride, 1.0f,
       o.second_of(o.dv2, keys, b, head), o.dv2.row_stride);
}

// One row of the softmax's backward: grad_scores = factor * p * (grad_p - sum(grad_p * p)) + grad_summed,
// where grad_p is that of the dropped weights times keep * keep_scale (with dropout).
void backward_row(const float* __restrict p, float* __restrict grad_p, const uint8_t* __restrict keep,
                  float keep_scale, const float* __restrict grad_summed, float factor, int64_t width,
                  float* __restrict grad_scores) {
  if (keep) apply_keep(keep, keep_scale, width, grad_p);
  float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
  for (int64_t c = 0; c < width; ++c) dot += grad_p[c] * p[c];
  if (grad_summed) {
#pragma omp simd
    for (int64_t c = 0; c < width; ++c) grad_p[c] = factor * p[c] * (grad_p[c] - dot) + grad_summed[c];
  } else {
#pragma omp simd
    for (int64_t c = 0; c < width; ++c) grad_p[c] = factor * p[c] * (grad_p[c] - dot);
  }
  if (grad_scores) std::memcpy(grad_scores, grad_p, width * sizeof(float));
}


// What a task of attention_backward keeps from chunk to chunk: the gradient of a chunk's weights
// (then of its scores), its dropped weights, and under key ranges its kept weights and dropout mask
// gathered into rows of the used columns, and the compact rows.
struct PlainBackwardBuffers {
  std::vector<float> grad_weights, dropped, probs;
  std::vector<uint8_t> keep;
  CompactRow compact;

  PlainBackwardBuffers(const CheckedBackward& o, int64_t chunk)
      : grad_weights(chunk * o.pieces.width), dropped(o.keep ? chunk * o.pieces.width : 0),
        probs(o.ranges ? chunk * o.pieces.width : 0), keep(o.ranges && o.keep ? chunk * o.pieces.width : 0),
        compact(o.ranges ? o.pieces.width : 0) {}
};

// One chunk of one head's queries of attention_backward.
void plain_backward_chunk(const CheckedBackward& o, const ChunkKeys& keys, int64_t b, int64_t head,
                          PlainBackwardBuffers& buffers) {
  const int64_t width = o.pieces.width, used = keys.used(), count = keys.count;
  const CompactRow::Layout& layout = keys.layout;
  const int64_t row0 = (b * o.heads + head) * o.rows + keys.first;
  // The kept weights and dropout's mask as [count, used] rows: in place, or the used columns gathered.
  const float* p = o.probs + row0 * width;
  const uint8_t* kept = o.keep ? o.keep + row0 * width : nullptr;
  if (keys.gaps) {
    p = layout.gather_rows(p, count, width, buffers.probs.data());
    kept = layout.gather_rows(kept, count, width, buffers.keep.data());
  }
  // grad of the (dropped) weights = grad_context @ values^T.
  float* g = buffers.grad_weights.data();
  o.grad_weights(keys, b, head, g);
  const float* weights = p;  // what the values were multiplied with
  if (kept) {
    for (int64_t i = 0; i < count; ++i) {
      drop(p + i * used, kept + i * used, o.dropped_scale, used, buffers.dropped.data() + i * used);
    }
    weights = buffers.dropped.data();
  }
  for (int64_t i = 0; i < count; ++i) {
    const int64_t row = row0 + i;
    const float* carried_grad = o.grad_summed ? o.grad_summed + row * width : nullptr;
    backward_row(p + i * used, g + i * used, kept ? kept + i * used : nullptr, o.dropped_scale,
                 keys.gaps ? buffers.compact.gather(layout, carried_grad, buffers.compact.carried) : carried_grad,
                 o.factor, used, keys.gaps ? nullptr : o.grad_scores + row * width);
    if (keys.gaps) layout.scatter_gradient(g + i * used, carried_grad, o.grad_scores + row * width, width);
  }
  // g now holds the scores' gradient.
  add_chunk_gradients(o, keys, b, head, g, weights);
}

// What a task of talking_heads_backward keeps: per chunk, all heads' gradients (`upstream`, `local`)
// and weights, what the forward kept gathered under key ranges, and, over its chunks, its own sums
// of the mixes' gradients and of the gradients of the keys other tasks share (`own`'s dk2 and dv2,
// and without a window dk1 and dv1).
struct TalkingBackwardThread {
  std::vector<float> upstream, local, weights, probs, summed;
  std::vector<uint8_t> keep;
  CompactRow compact;
  std::vector<float> first_keys_sum, first_values_sum, second_keys_sum, second_values_sum, pre_sum, post_sum;
  CheckedBackward own;

  TalkingBackwardThread(const CheckedBackward& o, int64_t stride, bool shared_first)
      : upstream(o.heads * stride), local(o.heads * stride), weights(o.heads * stride),
        probs(o.ranges ? o.heads * stride : 0), summed(o.ranges ? o.heads * stride : 0),
        keep(o.ranges && o.keep ? o.heads * stride : 0), compact(o.ranges ? o.pieces.width : 0),
        first_keys_sum(shared_first ? key_sums(o, o.pieces.first_rows) : 0),
        first_values_sum(shared_first ? key_sums(o, o.pieces.first_rows) : 0),
        second_keys_sum(key_sums(o, o.pieces.second_rows)), second_values_sum(key_sums(o, o.pieces.second_rows)),
        pre_sum(o.heads * o.heads, 0.0f), post_sum(o.heads * o.heads, 0.0f), own(o) {
    own.dk2 = rows_of(second_keys_sum, o.pieces.second_rows);
    own.dv2 = rows_of(second_values_sum, o.pieces.second_rows);
    if (shared_first) {
      own.dk1 = rows_of(first_keys_sum, o.pieces.first_rows);
      own.dv1 = rows_of(first_values_sum, o.pieces.first_rows);
    }
  }

  static int64_t key_sums(const CheckedBackward& o, int64_t key_rows) { return o.batch * o.heads * key_rows * o.size; }
  Rows<float> rows_of(std::vector<float>& data, int64_t key_rows) const {
    return Rows<float>(data.data(), own.heads * key_rows * own.size, key_rows * own.size, own.size);
  }
};

// What talking_heads_forward kept for a chunk, per head as [count, used] rows (`stride` apart).
struct KeptRows {
  const float* probs;
  const float* summed;
  const uint8_t* keep;
  int64_t stride;
};

// Talking heads' backward (see talking_heads_backward), a chunk of queries of all heads at a time.
struct TalkingBackward {
  const CheckedBackward& o;
  const float* pre;
  const float* post;
  const float* summed;
  int64_t stride;  // between heads' rows in a thread's buffers

  // In place, or the chunk's used columns gathered.
  KeptRows kept_rows(const ChunkKeys& keys, int64_t offset, TalkingBackwardThread& thread) const {
    const int64_t width = o.pieces.width, head_stride = o.rows * width;
    KeptRows kept{o.probs + offset, summed + offset, o.keep ? o.keep + offset : nullptr, head_stride};
    if (!keys.gaps) return kept;
    for (int64_t head = 0; head < o.heads; ++head) {
      keys.layout.gather_rows(kept.probs + head * head_stride, keys.count, width, thread.probs.data() + head * stride);
      keys.layout.gather_rows(kept.summed + head * head_stride, keys.count, width, thread.summed.data() + head * stride);
      if (kept.keep) {
        keys.layout.gather_rows(kept.keep + head * head_stride, keys.count, width, thread.keep.data() + head * stride);
      }
    }
    return {thread.probs.data(), thread.summed.data(), kept.keep ? thread.keep.data() : nullptr, stride};
  }

  // upstream: the gradient of the (dropped) weights, per head; weights: post @ probs, dropped (they
  // multiplied the values).
  void weights_and_their_gradient(const ChunkKeys& keys, int64_t b, const KeptRows& kept,
                                  TalkingBackwardThread& thread) const {
    const int64_t n = keys.count * keys.used();
    for (int64_t head = 0; head < o.heads; ++head) {
      float* g = thread.upstream.data() + head * stride;
      o.grad_weights(keys, b, head, g);
      if (kept.keep) apply_keep(kept.keep + head * kept.stride, o.dropped_scale, n, g);
    }
    float* weights = thread.weights.data();
    gemm(false, false, o.heads, n, o.heads, 1.0f, post, o.heads, kept.probs, kept.stride, 0.0f, weights, stride);
    for (int64_t head = 0; kept.keep && head < o.heads; ++head) {
      apply_keep(kept.keep + head * kept.stride, o.dropped_scale, n, weights + head * stride);
    }
  }

  // post: grad += upstream probs^T; the probs' gradient post^T upstream, through the softmax (into
  // local); pre: grad += (mixed logits' gradient) summed^T; the summed scores' gradient pre^T local
  // (into upstream).
  void through_the_mixes(const ChunkKeys& keys, const KeptRows& kept, TalkingBackwardThread& thread) const {
    const int64_t used = keys.used(), n = keys.count * used;
    float* upstream = thread.upstream.data();
    float* local = thread.local.data();
    gemm(false, true, o.heads, o.heads, n, 1.0f, upstream, stride, kept.probs, kept.stride, 1.0f,
         thread.post_sum.data(), o.heads);
    gemm(true, false, o.heads, n, o.heads, 1.0f, post, o.heads, upstream, stride, 0.0f, local, stride);
    for (int64_t head = 0; head < o.heads; ++head) {
      for (int64_t i = 0; i < keys.count; ++i) {
        backward_row(kept.probs + head * kept.stride + i * used, local + head * stride + i * used, nullptr, 1.0f,
                     nullptr, o.factor, used, nullptr);
      }
    }
    gemm(false, true, o.heads, o.heads, n, 1.0f, local, stride, kept.summed, kept.stride, 1.0f,
         thread.pre_sum.data(), o.heads);
    gemm(true, false, o.heads, n, o.heads, 1.0f, pre, o.heads, local, stride, 0.0f, upstream, stride);
  }

  // Per head: the summed scores' gradient (upstream, plus the one carried back) into grad_scores_out,
  // then the gradients of query, keys and values.
  void scores_and_inputs(const ChunkKeys& keys, int64_t b, int64_t offset, TalkingBackwardThread& thread) const {
    const int64_t width = o.pieces.width, used = keys.used(), head_stride = o.rows * width;
    for (int64_t head = 0; head < o.heads; ++head) {
      float* g = thread.upstream.data() + head * stride;
      float* out = o.grad_scores + offset + head * head_stride;
      const float* carried_grad = o.grad_summed ? o.grad_summed + offset + head * head_stride : nullptr;
      for (int64_t i = 0; i < keys.count; ++i) {
        float* row = g + i * used;
        const float* carried_row = carried_grad ? carried_grad + i * width : nullptr;
        if (carried_row) {
          const float* from = keys.gaps ? thread.compact.gather(keys.layout, carried_row, thread.compact.carried)
                                        : carried_row;
#pragma omp simd
          for (int64_t c = 0; c < used; ++c) row[c] += from[c];
        }
        if (keys.gaps) keys.layout.scatter_gradient(row, carried_row, out + i * width, width);
        else std::memcpy(out + i * width, row, used * sizeof(float));
      }
      add_chunk_gradients(thread.own, keys, b, head, g, thread.weights.data() + head * stride);
    }
  }

  void chunk(const ChunkKeys& keys, int64_t b, TalkingBackwardThread& thread) const {
    const int64_t offset = (b * o.heads * o.rows + keys.first) * o.pieces.width;  // head 0's chunk in [B, h, M, N]
    const KeptRows kept = kept_rows(keys, offset, thread);
    weights_and_their_gradient(keys, b, kept, thread);
    through_the_mixes(keys, kept, thread);
    scores_and_inputs(keys, b, offset, thread);
  }

  // A thread's sums into the totals (under `totals`).
  void add_totals(const TalkingBackwardThread& thread, bool shared_first, float* grad_pre, float* grad_post,
                  std::mutex& totals) const {
    const std::lock_guard<std::mutex> lock(totals);
    for (int64_t e = 0; e < o.heads * o.heads; ++e) {
      grad_pre[e] += thread.pre_sum[e];
      grad_post[e] += thread.post_sum[e];
    }
    const auto add = [&](const Rows<float>& total, const Rows<float>& part, int64_t key_rows) {
      for (int64_t bh = 0; bh < o.batch * o.heads; ++bh) {
        for (int64_t r = 0; r < key_rows; ++r) {
          float* into = total.at(bh / o.heads, bh % o.heads, r);
          const float* from = part.at(bh / o.heads, bh % o.heads, r);
          for (int64_t j = 0; j < o.size; ++j) into[j] += from[j];
        }
      }
    };
    add(o.dk2, thread.own.dk2, o.pieces.second_rows);
    add(o.dv2, thread.own.dv2, o.pieces.second_rows);
    if (shared_first) {
      add(o.dk1, thread.own.dk1, o.pieces.first_rows);
      add(o.dv1, thread.own.dv1, o.pieces.first_rows);
    }
  }
};

}  // namespace

// The gradients of attention_forward's: from grad_context [B, h, M, d] and grad_summed [B, h, M, N]
// (that of the summed scores carried on), grad_scores_out [B, h, M, N] (of the scores, the picked
// relative terms and the carried scores alike) is written and the gradients of query, keys and
// values (views at their strides, as their inputs) are added to. Tasks are (batch, head), the
// chunks of one head in turn: overlapping windows add to the same key rows.
void attention_backward(const BackwardOperands& operands) {
  const CheckedBackward o = checked_backward(operands);
  const int64_t chunk = o.ranges ? std::min<int64_t>(o.pieces.chunk(), kChunkWithRanges) : o.pieces.chunk();
  const int64_t chunks = (o.rows + chunk - 1) / chunk;

  at::parallel_for(0, o.batch * o.heads, 1, [&](int64_t begin, int64_t end) {
    PlainBackwardBuffers buffers(o, chunk);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t head = task % o.heads, b = task / o.heads;
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t first = c * chunk, count = std::min(chunk, o.rows - first);
        plain_backward_chunk(o, ChunkKeys(o.pieces, o.ranges, o.rows, b, first, count), b, head, buffers);
      }
    }
  });
}

// Talking heads' backward (tasks: chunks, all heads): from grad_context, the gradients of the
// summed scores (grad_scores_out, with grad_summed added), of the two mixes (added to grad_pre,
// grad_post) and of query, keys and values (added to), from what talking_heads_forward kept
// (probs, summed), all in cache. Keys that several chunks share add up per thread first: the
// second piece's, and without a window the first piece's too; with a window, chunks three blocks
// apart have disjoint windows, so the chunks run in three rounds and add to their windows in place.
void talking_heads_backward(const BackwardOperands& operands) {
  const CheckedBackward o = checked_backward(operands);
  const int64_t width = o.pieces.width;
  TORCH_CHECK(operands.summed.has_value() && operands.pre.has_value() && operands.post.has_value() &&
              operands.grad_pre.has_value() && operands.grad_post.has_value(),
              "talking_heads_backward needs summed, pre, post, grad_pre and grad_post");
  check_scores(operands.summed, "summed", operands.query, width);
  check_mix(*operands.pre, "pre", o.heads);
  check_mix(*operands.post, "post", o.heads);
  check_mix(*operands.grad_pre, "grad_pre", o.heads);
  check_mix(*operands.grad_post, "grad_post", o.heads);
  const Chunks parts(o.pieces, o.heads, o.rows, o.ranges ? kChunkWithRanges : o.rows);
  const TalkingBackward plan{o, operands.pre->data_ptr<float>(), operands.post->data_ptr<float>(),
                             operands.summed->data_ptr<float>(), parts.rows * width};
  // Per-thread sums of the shared keys' gradients: the second piece's, and the first's without a window.
  const bool shared_first = operands.window_block == 0;
  std::mutex totals;
  float* grad_pre = operands.grad_pre->data_ptr<float>();
  float* grad_post = operands.grad_post->data_ptr<float>();

  const int64_t rounds = shared_first ? 1 : 3;
  for (int64_t round = 0; round < rounds; ++round) {
    const int64_t round_chunks = (parts.count - round + rounds - 1) / rounds;
    at::parallel_for(0, o.batch * round_chunks, 1, [&](int64_t begin, int64_t end) {
      TalkingBackwardThread thread(o, plan.stride, shared_first);
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task / round_chunks;
        const auto part = parts.at((task % round_chunks) * rounds + round);
        plan.chunk(ChunkKeys(o.pieces, o.ranges, o.rows, b, part.first, part.count), b, thread);
      }
      plan.add_totals(thread, shared_first, grad_pre, grad_post, totals);
    });
  }
}

}  // namespace longdoc::attention
