// The backward of one softmax of global-local attention (see attention.h): attention_backward, and
// talking_heads_backward with the gradients of the heads' mixes.

#include <ATen/Parallel.h>

#include <mutex>
#include <tuple>

#include "attention.h"
#include "products.h"

namespace longdoc::attention {
namespace {

// The tensors of one softmax's backward, [B, h, N, d] at their strides, and its shape.
struct Operands {
  Rows<const float> q, k1, v1, k2, v2, grad_out;
  Rows<float> dq, dk1, dv1, dk2, dv2;
  int64_t batch, heads, rows, size;
  Pieces pieces;
};

// The operands of a backward, checked: [B, h, N, d] like the query, rows contiguous, each gradient
// shaped like its input; probs, keep, grad_summed and grad_scores_out [B, h, M, N].
Operands backward_operands(const at::Tensor& query, const at::Tensor& first_keys, const at::Tensor& first_values,
                           int64_t window_block, const at::Tensor& second_keys, const at::Tensor& second_values,
                           const at::Tensor& probs, const c10::optional<at::Tensor>& keep,
                           const at::Tensor& grad_context, const c10::optional<at::Tensor>& grad_summed,
                           const at::Tensor& grad_scores_out, const at::Tensor& grad_query,
                           const at::Tensor& grad_first_keys, const at::Tensor& grad_first_values,
                           const at::Tensor& grad_second_keys, const at::Tensor& grad_second_values) {
  for (const auto& [tensor, name] : {std::pair{&first_keys, "first_keys"}, {&first_values, "first_values"},
                                     {&second_keys, "second_keys"}, {&second_values, "second_values"},
                                     {&grad_context, "grad_context"}, {&grad_query, "grad_query"},
                                     {&grad_first_keys, "grad_first_keys"}, {&grad_first_values, "grad_first_values"},
                                     {&grad_second_keys, "grad_second_keys"},
                                     {&grad_second_values, "grad_second_values"}}) {
    check_rows(*tensor, name, query);
  }
  check_rows(query, "query", query);
  check_values(first_keys, first_values, second_keys, second_values);
  for (const auto& [grad, input, name] :
       {std::tuple{&grad_context, &query, "grad_context"}, {&grad_query, &query, "grad_query"},
        {&grad_first_keys, &first_keys, "grad_first_keys"}, {&grad_first_values, &first_values, "grad_first_values"},
        {&grad_second_keys, &second_keys, "grad_second_keys"},
        {&grad_second_values, &second_values, "grad_second_values"}}) {
    TORCH_CHECK(grad->sizes() == input->sizes(), name, " must be shaped like its input ", input->sizes(), ", not ",
                grad->sizes());
  }
  const Pieces pieces(window_block, first_keys.size(2), second_keys.size(2));
  check_scores(probs, "probs", query, pieces.width);
  check_scores(keep, "keep", query, pieces.width, at::kByte);
  check_scores(grad_summed, "grad_summed", query, pieces.width);
  check_scores(grad_scores_out, "grad_scores_out", query, pieces.width);
  return Operands{Rows<const float>(query), Rows<const float>(first_keys), Rows<const float>(first_values),
                  Rows<const float>(second_keys), Rows<const float>(second_values), Rows<const float>(grad_context),
                  Rows<float>(grad_query), Rows<float>(grad_first_keys), Rows<float>(grad_first_values),
                  Rows<float>(grad_second_keys), Rows<float>(grad_second_values), query.size(0), query.size(1),
                  query.size(2), query.size(3), pieces};
}

// For the chunk of `count` queries from `first` (keys `span` of the first piece, second keys
// `layout.low .. high`): from g, the gradient of its scores, and the weights that multiplied the
// values (rows of the layout's used columns): dq += alpha g k, dk += alpha g^T q, dv += weights^T
// grad_out, over both pieces.
void add_chunk_gradients(const Operands& o, const Pieces::Span& span, const CompactRow::Layout& layout, int64_t b,
                         int64_t head, int64_t first, int64_t count, float alpha, const float* g, const float* weights) {
  const int64_t used = layout.used(), d = o.size;
  const int64_t real_keys = span.end - span.begin, second = layout.high - layout.low, at = layout.first_width;
  const float* query_rows = o.q.at(b, head, first);
  const float* grad_rows = o.grad_out.at(b, head, first);
  float* dq = o.dq.at(b, head, first);
  gemm(false, false, count, d, real_keys, alpha, g + span.column, used, o.k1.at(b, head, span.begin),
       o.k1.row_stride, 1.0f, dq, o.dq.row_stride);
  gemm(false, false, count, d, second, alpha, g + at, used, o.k2.at(b, head, layout.low), o.k2.row_stride, 1.0f, dq,
       o.dq.row_stride);
  gemm(true, false, real_keys, d, count, alpha, g + span.column, used, query_rows, o.q.row_stride, 1.0f,
       o.dk1.at(b, head, span.begin), o.dk1.row_stride);
  gemm(true, false, second, d, count, alpha, g + at, used, query_rows, o.q.row_stride, 1.0f,
       o.dk2.at(b, head, layout.low), o.dk2.row_stride);
  gemm(true, false, real_keys, d, count, 1.0f, weights + span.column, used, grad_rows, o.grad_out.row_stride, 1.0f,
       o.dv1.at(b, head, span.begin), o.dv1.row_stride);
  gemm(true, false, second, d, count, 1.0f, weights + at, used, grad_rows, o.grad_out.row_stride, 1.0f,
       o.dv2.at(b, head, layout.low), o.dv2.row_stride);
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

}  // namespace

// The gradients of attention_forward's: from grad_context [B, h, M, d] and grad_summed [B, h, M, N]
// (that of the summed scores carried on), grad_scores_out [B, h, M, N] (of the scores, the picked
// relative terms and the carried scores alike) is written and the gradients of query, keys and
// values (views at their strides, as their inputs) are added to. Tasks are (batch, head), the
// chunks of one head in turn: overlapping windows add to the same key rows.
void attention_backward(const at::Tensor& query, double query_scale, const at::Tensor& first_keys,
                        const at::Tensor& first_values, int64_t window_block, const at::Tensor& second_keys,
                        const at::Tensor& second_values, const at::Tensor& probs, const c10::optional<at::Tensor>& keep,
                        double keep_scale, const at::Tensor& grad_context, const c10::optional<at::Tensor>& grad_summed,
                        double scale, const at::Tensor& grad_scores_out, const at::Tensor& grad_query,
                        const at::Tensor& grad_first_keys, const at::Tensor& grad_first_values,
                        const at::Tensor& grad_second_keys, const at::Tensor& grad_second_values,
                        const c10::optional<at::Tensor>& key_ranges) {
  const Operands o = backward_operands(query, first_keys, first_values, window_block, second_keys, second_values, probs,
                                       keep, grad_context, grad_summed, grad_scores_out, grad_query, grad_first_keys,
                                       grad_first_values, grad_second_keys, grad_second_values);
  const int64_t width = o.pieces.width;

  const float* probs_data = probs.data_ptr<float>();
  const uint8_t* keep_data = keep.has_value() ? keep->data_ptr<uint8_t>() : nullptr;
  const float* grad_summed_data = data_or_null(grad_summed);
  float* grad_scores = grad_scores_out.data_ptr<float>();
  const float factor = static_cast<float>(scale), alpha = static_cast<float>(query_scale);
  const float dropped_scale = static_cast<float>(keep_scale);
  const int32_t* ranges = checked_ranges(key_ranges, o.batch, o.rows, window_block);
  const int64_t chunk = ranges ? std::min<int64_t>(o.pieces.chunk(), kChunkWithRanges) : o.pieces.chunk();
  const int64_t chunks = (o.rows + chunk - 1) / chunk;

  at::parallel_for(0, o.batch * o.heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> grad_weights(chunk * width), dropped(keep_data ? chunk * width : 0);
    std::vector<float> probs_buffer(ranges ? chunk * width : 0);
    std::vector<uint8_t> keep_buffer(ranges && keep_data ? chunk * width : 0);
    CompactRow compact(ranges ? width : 0);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t head = task % o.heads, b = task / o.heads;
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t first = c * chunk, count = std::min(chunk, o.rows - first);
        const auto span = o.pieces.keys_of(first);
        const auto [low, high] = ranges ? chunk_range(ranges + 2 * (b * o.rows + first), count)
                                        : std::pair<int64_t, int64_t>{0, o.pieces.second_rows};
        const CompactRow::Layout layout{o.pieces.first_width, low, high};
        const bool gaps = high - low < o.pieces.second_rows;
        const int64_t used = layout.used();  // a row's columns
        const float* grad_rows = o.grad_out.at(b, head, first);
        const int64_t row0 = (b * o.heads + head) * o.rows + first;
        // The kept weights and dropout's mask as [count, used] rows: in place, or the used columns gathered.
        const float* p = probs_data + row0 * width;
        const uint8_t* kept = keep_data ? keep_data + row0 * width : nullptr;
        if (gaps) {
          p = layout.gather_rows(p, count, width, probs_buffer.data());
          kept = layout.gather_rows(kept, count, width, keep_buffer.data());
        }
        // grad of the (dropped) weights = grad_context @ values^T.
        float* g = grad_weights.data();
        o.pieces.zero_padding(span, count, g, used);
        gemm(false, true, count, span.end - span.begin, o.size, 1.0f, grad_rows, o.grad_out.row_stride,
             o.v1.at(b, head, span.begin), o.v1.row_stride, 0.0f, g + span.column, used);
        gemm(false, true, count, high - low, o.size, 1.0f, grad_rows, o.grad_out.row_stride, o.v2.at(b, head, low),
             o.v2.row_stride, 0.0f, g + o.pieces.first_width, used);
        const float* weights = p;  // what the values were multiplied with
        if (kept) {
          for (int64_t i = 0; i < count; ++i) {
            drop(p + i * used, kept + i * used, dropped_scale, used, dropped.data() + i * used);
          }
          weights = dropped.data();
        }
        for (int64_t i = 0; i < count; ++i) {
          const int64_t row = row0 + i;
          const float* carried_grad = grad_summed_data ? grad_summed_data + row * width : nullptr;
          backward_row(p + i * used, g + i * used, kept ? kept + i * used : nullptr, dropped_scale,
                       gaps ? compact.gather(layout, carried_grad, compact.carried) : carried_grad, factor, used,
                       gaps ? nullptr : grad_scores + row * width);
          if (gaps) layout.scatter_gradient(g + i * used, carried_grad, grad_scores + row * width, width);
        }
        // g now holds the scores' gradient.
        add_chunk_gradients(o, span, layout, b, head, first, count, alpha, g, weights);
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
void talking_heads_backward(const at::Tensor& query, double query_scale, const at::Tensor& first_keys,
                            const at::Tensor& first_values, int64_t window_block, const at::Tensor& second_keys,
                            const at::Tensor& second_values, const at::Tensor& probs, const at::Tensor& summed,
                            const c10::optional<at::Tensor>& keep, double keep_scale, const at::Tensor& pre,
                            const at::Tensor& post, const at::Tensor& grad_context,
                            const c10::optional<at::Tensor>& grad_summed, double scale,
                            const at::Tensor& grad_scores_out, const at::Tensor& grad_pre, const at::Tensor& grad_post,
                            const at::Tensor& grad_query, const at::Tensor& grad_first_keys,
                            const at::Tensor& grad_first_values, const at::Tensor& grad_second_keys,
                            const at::Tensor& grad_second_values, const c10::optional<at::Tensor>& key_ranges) {
  const Operands o = backward_operands(query, first_keys, first_values, window_block, second_keys, second_values, probs,
                                       keep, grad_context, grad_summed, grad_scores_out, grad_query, grad_first_keys,
                                       grad_first_values, grad_second_keys, grad_second_values);
  const int64_t width = o.pieces.width;
  check_scores(summed, "summed", query, width);
  check_mix(pre, "pre", o.heads);
  check_mix(post, "post", o.heads);
  check_mix(grad_pre, "grad_pre", o.heads);
  check_mix(grad_post, "grad_post", o.heads);

  const float* probs_data = probs.data_ptr<float>();
  const float* summed_data = summed.data_ptr<float>();
  const uint8_t* keep_data = keep.has_value() ? keep->data_ptr<uint8_t>() : nullptr;
  const float* pre_data = pre.data_ptr<float>();
  const float* post_data = post.data_ptr<float>();
  const float* grad_summed_data = data_or_null(grad_summed);
  float* grad_scores = grad_scores_out.data_ptr<float>();
  const float factor = static_cast<float>(scale), dropped_scale = static_cast<float>(keep_scale);
  const float alpha = static_cast<float>(query_scale);
  const int32_t* ranges = checked_ranges(key_ranges, o.batch, o.rows, window_block);
  const Chunks parts(o.pieces, o.heads, o.rows, ranges ? kChunkWithRanges : o.rows);
  const int64_t chunk = parts.rows, stride = chunk * width;
  const int64_t head_stride = o.rows * width;  // of the [B, h, M, N] tensors
  // Per-thread sums of the shared keys' gradients: the second piece's, and the first's without a window.
  const bool shared_first = window_block == 0;
  const int64_t first_size = shared_first ? o.batch * o.heads * o.pieces.first_rows * o.size : 0;
  const int64_t second_size = o.batch * o.heads * o.pieces.second_rows * o.size;
  std::mutex totals;
  float* grad_pre_data = grad_pre.data_ptr<float>();
  float* grad_post_data = grad_post.data_ptr<float>();

  const int64_t rounds = shared_first ? 1 : 3;
  for (int64_t round = 0; round < rounds; ++round) {
    const int64_t round_chunks = (parts.count - round + rounds - 1) / rounds;
    at::parallel_for(0, o.batch * round_chunks, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> upstream_buffer(o.heads * stride), local_buffer(o.heads * stride);
      std::vector<float> weights_buffer(o.heads * stride);
      std::vector<float> probs_buffer(ranges ? o.heads * stride : 0), summed_buffer(ranges ? o.heads * stride : 0);
      std::vector<uint8_t> keep_buffer(ranges && keep_data ? o.heads * stride : 0);
      CompactRow compact(ranges ? width : 0);
      std::vector<float> first_keys_sum(first_size), first_values_sum(first_size);
      std::vector<float> second_keys_sum(second_size), second_values_sum(second_size);
      std::vector<float> pre_sum(o.heads * o.heads, 0.0f), post_sum(o.heads * o.heads, 0.0f);
      float* upstream = upstream_buffer.data();
      float* local = local_buffer.data();
      Operands own = o;  // the shared keys' gradients into this thread's sums
      const auto sums = [&](std::vector<float>& data, int64_t key_rows) {
        return Rows<float>(data.data(), o.heads * key_rows * o.size, key_rows * o.size, o.size);
      };
      own.dk2 = sums(second_keys_sum, o.pieces.second_rows);
      own.dv2 = sums(second_values_sum, o.pieces.second_rows);
      if (shared_first) {
        own.dk1 = sums(first_keys_sum, o.pieces.first_rows);
        own.dv1 = sums(first_values_sum, o.pieces.first_rows);
      }
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task / round_chunks;
        const auto [first, count, span] = parts.at((task % round_chunks) * rounds + round);
        const int64_t offset = (b * o.heads * o.rows + first) * width;  // head 0's chunk in [B, h, M, N]
        const auto [low, high] = ranges ? chunk_range(ranges + 2 * (b * o.rows + first), count)
                                        : std::pair<int64_t, int64_t>{0, o.pieces.second_rows};
        const CompactRow::Layout layout{o.pieces.first_width, low, high};
        const bool gaps = high - low < o.pieces.second_rows;
        const int64_t used = layout.used(), n = count * used;
        // What the forward kept, per head as [count, used] rows: in place, or the used columns gathered.
        const float* p = probs_data + offset;
        const float* summed_rows = summed_data + offset;
        const uint8_t* kept = keep_data ? keep_data + offset : nullptr;
        int64_t kept_stride = head_stride;  // between heads
        if (gaps) {
          for (int64_t head = 0; head < o.heads; ++head) {
            layout.gather_rows(p + head * head_stride, count, width, probs_buffer.data() + head * stride);
            layout.gather_rows(summed_rows + head * head_stride, count, width, summed_buffer.data() + head * stride);
            if (kept) layout.gather_rows(kept + head * head_stride, count, width, keep_buffer.data() + head * stride);
          }
          p = probs_buffer.data();
          summed_rows = summed_buffer.data();
          kept = kept ? keep_buffer.data() : nullptr;
          kept_stride = stride;
        }
        // The gradient of the (dropped) weights, per head: grad_context @ values^T.
        for (int64_t head = 0; head < o.heads; ++head) {
          float* g = upstream + head * stride;
          const float* grad_rows = o.grad_out.at(b, head, first);
          o.pieces.zero_padding(span, count, g, used);
          gemm(false, true, count, span.end - span.begin, o.size, 1.0f, grad_rows, o.grad_out.row_stride,
               o.v1.at(b, head, span.begin), o.v1.row_stride, 0.0f, g + span.column, used);
          gemm(false, true, count, high - low, o.size, 1.0f, grad_rows, o.grad_out.row_stride, o.v2.at(b, head, low),
               o.v2.row_stride, 0.0f, g + o.pieces.first_width, used);
          if (kept) apply_keep(kept + head * kept_stride, dropped_scale, n, g);
        }
        // The weights again (post @ probs, dropped): they multiplied the values.
        float* weights = weights_buffer.data();
        gemm(false, false, o.heads, n, o.heads, 1.0f, post_data, o.heads, p, kept_stride, 0.0f, weights, stride);
        for (int64_t head = 0; kept && head < o.heads; ++head) {
          apply_keep(kept + head * kept_stride, dropped_scale, n, weights + head * stride);
        }
        // post: grad += g probs^T; the probs' gradient post^T g, through the softmax.
        gemm(false, true, o.heads, o.heads, n, 1.0f, upstream, stride, p, kept_stride, 1.0f, post_sum.data(),
             o.heads);
        gemm(true, false, o.heads, n, o.heads, 1.0f, post_data, o.heads, upstream, stride, 0.0f, local, stride);
        for (int64_t head = 0; head < o.heads; ++head) {
          for (int64_t i = 0; i < count; ++i) {
            backward_row(p + head * kept_stride + i * used, local + head * stride + i * used, nullptr, 1.0f,
                         nullptr, factor, used, nullptr);
          }
        }
        // pre: grad += (mixed logits' gradient) summed^T; the summed scores' gradient pre^T (..).
        gemm(false, true, o.heads, o.heads, n, 1.0f, local, stride, summed_rows, kept_stride, 1.0f,
             pre_sum.data(), o.heads);
        gemm(true, false, o.heads, n, o.heads, 1.0f, pre_data, o.heads, local, stride, 0.0f, upstream, stride);
        for (int64_t head = 0; head < o.heads; ++head) {
          float* g = upstream + head * stride;
          float* out = grad_scores + offset + head * head_stride;
          const float* carried_grad = grad_summed_data ? grad_summed_data + offset + head * head_stride : nullptr;
          for (int64_t i = 0; i < count; ++i) {
            float* row = g + i * used;
            const float* carried_row = carried_grad ? carried_grad + i * width : nullptr;
            if (carried_row) {
              const float* from = gaps ? compact.gather(layout, carried_row, compact.carried) : carried_row;
#pragma omp simd
              for (int64_t c = 0; c < used; ++c) row[c] += from[c];
            }
            if (gaps) layout.scatter_gradient(row, carried_row, out + i * width, width);
            else std::memcpy(out + i * width, row, used * sizeof(float));
          }
          add_chunk_gradients(own, span, layout, b, head, first, count, alpha, g, weights + head * stride);
        }
      }
      const std::lock_guard<std::mutex> lock(totals);
      for (int64_t e = 0; e < o.heads * o.heads; ++e) {
        grad_pre_data[e] += pre_sum[e];
        grad_post_data[e] += post_sum[e];
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
      add(o.dk2, own.dk2, o.pieces.second_rows);
      add(o.dv2, own.dv2, o.pieces.second_rows);
      if (shared_first) {
        add(o.dk1, own.dk1, o.pieces.first_rows);
        add(o.dv1, own.dv1, o.pieces.first_rows);
      }
    });
  }
}


}  // namespace longdoc::attention
