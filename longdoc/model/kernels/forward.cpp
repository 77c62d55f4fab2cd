// The forward of one softmax of global-local attention (see attention.h): attention_forward, and
// talking_heads_forward with the heads' mixes on either side of the softmax.

#include <ATen/Parallel.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <cmath>

#include "attention.h"
#include "products.h"

namespace longdoc::attention {
namespace {

// exp(x) as pure arithmetic (Cephes' expf: Cody-Waite range reduction, degree-6 polynomial,
// relative error below 2e-7), so that the compiler vectorises the loops that call it; 0 below
// -87 (where float's exp underflows), which is where masked keys land. One set of constants for
// exp_approx and its AVX-512 form exp_vector.
struct Cephes {
  static constexpr float kLowest = -87.0f, kHighest = 88.0f, kLog2e = 1.44269504088896341f;
  static constexpr float kLn2High = 0.693359375f, kLn2Low = -2.12194440e-4f;  // ln 2 = high + low
  static constexpr float kPolynomial[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                           4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
};

inline float exp_approx(float x) {
  const float low = x < Cephes::kLowest ? Cephes::kLowest : x;  // (comparisons, not fmin/fmax, which must honour NaN and do not vectorise)
  const float clamped = low > Cephes::kHighest ? Cephes::kHighest : low;
  const float n = std::floor(clamped * Cephes::kLog2e + 0.5f);
  float r = clamped - n * Cephes::kLn2High;
  r = r - n * Cephes::kLn2Low;
  float p = Cephes::kPolynomial[0];
  for (int i = 1; i < 6; ++i) p = p * r + Cephes::kPolynomial[i];
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float power;
  std::memcpy(&power, &bits, sizeof(power));
  return x < Cephes::kLowest ? 0.0f : p * power;
}

#if defined(__AVX512F__)
// A row's relative terms, table[id], 16 columns at a time from at most 64 terms held in four
// registers: two permutes and a blend, instead of the slower gather the compiler emits.
struct SmallTable {
  static constexpr int64_t kMaxVocab = 64;
  __m512 part[4];

  SmallTable(const float* table, int64_t vocab) {
    for (int64_t j = 0; j < 4; ++j) {
      const int64_t count = std::min<int64_t>(std::max<int64_t>(vocab - 16 * j, 0), 16);
      part[j] = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << count) - 1), table + 16 * j);
    }
  }

  __m512 operator()(__m512i ids) const {
    const __m512 low = _mm512_permutex2var_ps(part[0], ids, part[1]);  // ids 0-31 (bits 0-4)
    const __m512 high = _mm512_permutex2var_ps(part[2], ids, part[3]);  // ids 32-63
    return _mm512_mask_blend_ps(_mm512_test_epi32_mask(ids, _mm512_set1_epi32(32)), low, high);
  }
};

// The first pass of `one_row` over whole vectors of 16 columns, with a small table; returns the
// columns done (the rest are the scalar loop's), and folds their largest value into `largest`.
// With `stream` the summed scores are written with non-temporal stores from the row's first 64-byte
// boundary on: they go to memory that nothing reads before the next layer, and such a store does not
// first read the line it overwrites (where the sums go to a fresh tensor, as in training and in the
// first layer; written over the carried scores, whose lines were just read, they are stored as usual).
template <bool kCarry, bool kSummed, bool kSoftmax>
int64_t first_pass_with_small_table(const float* s, const float* table, int64_t vocab, const int32_t* id,
                                    const float* carry, const float* mask, float factor, int64_t width, float* x,
                                    float* summed, bool stream, float* largest) {
  const SmallTable lookup(table, vocab);
  const __m512 scale = _mm512_set1_ps(factor);
  __m512 top = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const auto columns = [&](int64_t c, __mmask16 lanes, bool streamed) {
    __m512 value = _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, s + c),
                                 lookup(_mm512_maskz_loadu_epi32(lanes, id + c)));
    if (kCarry) {
      // Carried rows come from memory (100 MB a layer at 4096 tokens), read in order but across
      // pages: fetched 8 KB (2048 floats) ahead, which measured faster (any distance from 512 to
      // 4096 floats did about as well). A prefetch never faults, past the tensor's end included.
      _mm_prefetch(reinterpret_cast<const char*>(carry + c + 2048), _MM_HINT_T0);
      value = _mm512_add_ps(value, _mm512_maskz_loadu_ps(lanes, carry + c));
    }
    if (kSummed && streamed) _mm512_stream_ps(summed + c, value);
    if (kSummed && !streamed) _mm512_mask_storeu_ps(summed + c, lanes, value);
    if (kSoftmax) {
      value = _mm512_fmadd_ps(scale, value, _mm512_maskz_loadu_ps(lanes, mask + c));
      _mm512_mask_storeu_ps(x + c, lanes, value);
      top = _mm512_mask_max_ps(top, lanes, top, value);
    }
  };
  int64_t c = 0;
  if (kSummed && stream) {  // the columns before the first aligned one, masked
    c = std::min<int64_t>(width, (64 - reinterpret_cast<uintptr_t>(summed) % 64) % 64 / sizeof(float));
    if (c > 0) columns(0, static_cast<__mmask16>((1u << c) - 1), false);
  }
  for (; c + 16 <= width; c += 16) columns(c, 0xFFFF, kSummed && stream);
  if (kSoftmax) *largest = std::max(*largest, _mm512_reduce_max_ps(top));
  return c;
}

// exp_approx on 16 lanes, where the compiler's vectorisation of it spends 40 instructions a vector
// on its comparisons: clamped by min/max (the bound first, so that NaN propagates as there), 2^n
// by scalef.
inline __m512 exp_vector(__m512 x) {
  const __m512 lowest = _mm512_set1_ps(Cephes::kLowest);
  const __m512 clamped = _mm512_min_ps(_mm512_set1_ps(Cephes::kHighest), _mm512_max_ps(lowest, x));
  const __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(clamped, _mm512_set1_ps(Cephes::kLog2e), _mm512_set1_ps(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(Cephes::kLn2High), clamped);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(Cephes::kLn2Low), r);
  __m512 p = _mm512_set1_ps(Cephes::kPolynomial[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(Cephes::kPolynomial[i]));
  p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  const __mmask16 above = _mm512_cmp_ps_mask(x, lowest, _CMP_NLT_UQ);  // (NaN included)
  return _mm512_maskz_scalef_ps(above, p, n);
}

// The softmax's numerators exp(x - largest) of a row into probs, the last vector masked; returns their sum.
float exponentials(const float* x, float largest, int64_t width, float* probs) {
  const __m512 shift = _mm512_set1_ps(largest);
  __m512 total = _mm512_setzero_ps();
  for (int64_t c = 0; c < width; c += 16) {
    const __mmask16 lanes = width - c >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (width - c)) - 1);
    const __m512 numerator = exp_vector(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, x + c), shift));
    _mm512_mask_storeu_ps(probs + c, lanes, numerator);
    total = _mm512_mask_add_ps(total, lanes, total, numerator);
  }
  return _mm512_reduce_add_ps(total);
}
#endif

// One row: summed = s + table[id] + carry (the terms present; stored unless summed is null), then
// probs = softmax(factor * summed + mask), or without `normalize` its numerators exp(.. - max),
// returning 1 / their sum (the caller scales what it computes from them: d numbers, not N). A
// template per combination of terms, so that the first loop has no branches: it reads the row's
// inputs once into x (in L1). Restrict-qualified and outside the parallel loop's closure, so that
// every loop vectorises; summed and probs may alias s or carry (each row is read before it is written).
// `stream_summed`: the sums bypass the cache where the small-table pass writes them (see there).
template <bool kRelative, bool kCarry, bool kSummed, bool kSoftmax>
float one_row(const float* s, const float* __restrict table, const int64_t vocab, const int32_t* __restrict id,
              const float* carry, const float* __restrict mask, const float factor, const int64_t width,
              float* __restrict x, float* summed, float* probs, const bool normalize, const bool stream_summed) {
  float largest = -std::numeric_limits<float>::infinity();
  int64_t start = 0;  // columns the first pass has done
#if defined(__AVX512F__)
  if (kRelative && vocab <= SmallTable::kMaxVocab) {
    start = first_pass_with_small_table<kCarry, kSummed || !kSoftmax, kSoftmax>(s, table, vocab, id, carry, mask,
                                                                               factor, width, x, summed,
                                                                               stream_summed, &largest);
  }
#endif
  if (!kSoftmax) {  // the sum alone (talking heads mix the heads before their softmax)
    for (int64_t c = start; c < width; ++c) {
      float value = s[c];
      if (kRelative) value += table[id[c]];
      if (kCarry) value += carry[c];
      summed[c] = value;
    }
    return 0.0f;
  }
#pragma omp simd reduction(max : largest)
  for (int64_t c = start; c < width; ++c) {
    float value = s[c];
    if (kRelative) value += table[id[c]];
    if (kCarry) value += carry[c];
    if (kSummed) summed[c] = value;
    value = factor * value + mask[c];
    x[c] = value;
    largest = value > largest ? value : largest;
  }
#if defined(__AVX512F__)
  const float total = exponentials(x, largest, width, probs);
#else
  float total = 0.0f;
#pragma omp simd reduction(+ : total)
  for (int64_t c = 0; c < width; ++c) {
    const float numerator = exp_approx(x[c] - largest);
    probs[c] = numerator;
    total += numerator;
  }
#endif
  const float inverse = 1.0f / total;
  if (normalize) {
#pragma omp simd
    for (int64_t c = 0; c < width; ++c) probs[c] *= inverse;
  }
  return inverse;
}

using RowFunction = float (*)(const float*, const float*, int64_t, const int32_t*, const float*, const float*, float,
                              int64_t, float*, float*, float*, bool, bool);

template <bool kRelative, bool kCarry, bool kSummed>
RowFunction with_softmax(bool softmax) {
  return softmax ? one_row<kRelative, kCarry, kSummed, true> : one_row<kRelative, kCarry, kSummed, false>;
}

template <bool kRelative, bool kCarry>
RowFunction with_summed(bool summed, bool softmax) {
  return summed ? with_softmax<kRelative, kCarry, true>(softmax) : with_softmax<kRelative, kCarry, false>(softmax);
}

template <bool kRelative>
RowFunction with_carry(bool carry, bool summed, bool softmax) {
  return carry ? with_summed<kRelative, true>(summed, softmax) : with_summed<kRelative, false>(summed, softmax);
}

RowFunction row_function(bool relative, bool carry, bool summed, bool softmax) {
  return relative ? with_carry<true>(carry, summed, softmax) : with_carry<false>(carry, summed, softmax);
}

// The inputs and outputs of a forward (attention_forward, talking_heads_forward), checked:
// query [B, h, M, d] (unscaled: query_scale multiplies q.k); keys and values [B, h, N1 | N2, d];
// context_out [B, h, M, d]: all at their strides. relative [B, h, M, R]; ids (int32), mask_bias
// [B, M, N]; carried, summed_out, probs_out (the weights autograd keeps, before dropout), keep
// (uint8, dropout's mask, with probs_out): [B, h, M, N], contiguous. summed_out may be carried.
struct ForwardOperands {
  int64_t batch, heads, rows, size, vocab;
  Pieces pieces;
  Rows<const float> q, k1, v1, k2, v2;
  Rows<float> context;
  // Set once their tensors are checked.
  const float* relative = nullptr;
  const int32_t* ids = nullptr;
  const float* carried = nullptr;
  const float* mask = nullptr;
  const uint8_t* keep = nullptr;
  float* summed = nullptr;
  float* probs = nullptr;

  ForwardOperands(const at::Tensor& query, const at::Tensor& first_keys, const at::Tensor& first_values,
                  int64_t window_block, const at::Tensor& second_keys, const at::Tensor& second_values,
                  const c10::optional<at::Tensor>& relative_terms, const c10::optional<at::Tensor>& relative_ids,
                  const c10::optional<at::Tensor>& carried_scores, const at::Tensor& mask_bias,
                  const c10::optional<at::Tensor>& keep_mask, const c10::optional<at::Tensor>& summed_out,
                  const c10::optional<at::Tensor>& probs_out, const at::Tensor& context_out)
      : batch(query.size(0)), heads(query.size(1)), rows(query.size(2)), size(query.size(3)), vocab(0),
        pieces(window_block, first_keys.size(2), second_keys.size(2)), q(checked(query, "query", query)),
        k1(checked(first_keys, "first_keys", query)), v1(checked(first_values, "first_values", query)),
        k2(checked(second_keys, "second_keys", query)), v2(checked(second_values, "second_values", query)),
        context(checked(context_out, "context_out", query)) {
    const int64_t width = pieces.width;
    check_values(first_keys, first_values, second_keys, second_values);
    TORCH_CHECK(context_out.size(2) == rows, "context_out must have the query's ", rows, " rows, not ",
                context_out.size(2));
    check(mask_bias, "mask_bias", at::kFloat, 3);
    TORCH_CHECK(mask_bias.sizes() == at::IntArrayRef({batch, rows, width}), "mask_bias must be [B, M, N] = [", batch,
                ", ", rows, ", ", width, "], not ", mask_bias.sizes());
    check_scores(carried_scores, "carried", query, width);
    check_scores(summed_out, "summed_out", query, width);
    check_scores(probs_out, "probs_out", query, width);
    check_scores(keep_mask, "keep", query, width, at::kByte);
    TORCH_CHECK(!keep_mask.has_value() || probs_out.has_value(), "dropout's keep mask comes with probs_out");
    TORCH_CHECK(relative_terms.has_value() == relative_ids.has_value(), "relative and ids come together");
    if (relative_terms.has_value()) {
      check(*relative_terms, "relative", at::kFloat, 4);
      check(*relative_ids, "ids", at::kInt, 3);
      vocab = relative_terms->size(3);
      TORCH_CHECK(relative_terms->size(2) == rows, "relative must be [B, h, M, R] with M = ", rows, ", not ",
                  relative_terms->sizes());
      TORCH_CHECK(relative_ids->sizes() == mask_bias.sizes(), "ids must be [B, M, N] like mask_bias ",
                  mask_bias.sizes(), ", not ", relative_ids->sizes());
      relative = relative_terms->data_ptr<float>();
      ids = relative_ids->data_ptr<int32_t>();
    }
    carried = data_or_null(carried_scores);
    mask = mask_bias.data_ptr<float>();
    keep = keep_mask.has_value() ? keep_mask->data_ptr<uint8_t>() : nullptr;
    summed = summed_out.has_value() ? summed_out->data_ptr<float>() : nullptr;
    probs = probs_out.has_value() ? probs_out->data_ptr<float>() : nullptr;
  }

  static const at::Tensor& checked(const at::Tensor& tensor, const char* name, const at::Tensor& query) {
    check_rows(tensor, name, query);
    return tensor;
  }
};

// Talking heads without a window (the global queries) in three passes, so that the q.k and weights
// @ values GEMMs run per head over 128 queries as without talking heads, rather than over the few
// queries whose scores of all heads fit in cache (they read all the long keys and values each
// time). The summed scores and the weights make a round trip through memory instead (53 MB each at
// 4096 tokens).
void talking_heads_in_passes(const ForwardOperands& f, float alpha, float factor, const float* pre,
                             const float* post, float dropped_scale) {
  const int64_t width = f.pieces.width, head_stride = f.rows * width, heads = f.heads;
  at::Tensor own_sums, weights_tensor = at::empty({f.batch * heads * head_stride}, at::kFloat);
  float* sums = f.summed;
  if (!sums) {
    own_sums = at::empty({f.batch * heads * head_stride}, at::kFloat);
    sums = own_sums.data_ptr<float>();
  }
  float* weights = weights_tensor.data_ptr<float>();
  const bool terms = f.relative != nullptr || f.carried != nullptr;
  const RowFunction add_terms = row_function(f.relative != nullptr, f.carried != nullptr, true, false);
  const RowFunction softmax = row_function(false, false, false, true);
  const int64_t chunk = f.pieces.chunk(), chunks = (f.rows + chunk - 1) / chunk;

  // 1. Per (batch, chunk, head): the summed scores, into memory.
  at::parallel_for(0, f.batch * chunks * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> x(width);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t head = task % heads, c = (task / heads) % chunks, b = task / heads / chunks;
      const int64_t first = c * chunk, count = std::min(chunk, f.rows - first);
      const int64_t row0 = (b * heads + head) * f.rows + first;
      float* s = sums + row0 * width;
      const float* query_rows = f.q.at(b, head, first);
      gemm(false, true, count, f.pieces.first_rows, f.size, alpha, query_rows, f.q.row_stride, f.k1.at(b, head, 0),
           f.k1.row_stride, 0.0f, s, width);
      gemm(false, true, count, f.pieces.second_rows, f.size, alpha, query_rows, f.q.row_stride, f.k2.at(b, head, 0),
           f.k2.row_stride, 0.0f, s + f.pieces.first_width, width);
      for (int64_t i = 0; terms && i < count; ++i) {
        add_terms(s + i * width, f.relative ? f.relative + (row0 + i) * f.vocab : nullptr, f.vocab,
                  f.ids ? f.ids + (b * f.rows + first + i) * width : nullptr,
                  f.carried ? f.carried + (row0 + i) * width : nullptr, nullptr, 1.0f, width, x.data(),
                  s + i * width, nullptr, false, false);
      }
    }
  });
  // 2. Per (batch, group of queries), all heads in cache: mix, softmax, mix, dropout -> weights.
  const int64_t group = f.pieces.chunk(heads), groups = (f.rows + group - 1) / group, stride = group * width;
  at::parallel_for(0, f.batch * groups, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> mixed_buffer(heads * stride), x(width);
    float* mixed = mixed_buffer.data();
    for (int64_t task = begin; task < end; ++task) {
      const int64_t g = task % groups, b = task / groups;
      const int64_t first = g * group, count = std::min(group, f.rows - first), n = count * width;
      const int64_t offset = (b * heads * f.rows + first) * width, shared0 = b * f.rows + first;
      gemm(false, false, heads, n, heads, 1.0f, pre, heads, sums + offset, head_stride, 0.0f, mixed, stride);
      for (int64_t head = 0; head < heads; ++head) {
        float* m = mixed + head * stride;
        for (int64_t i = 0; i < count; ++i) {
          softmax(m + i * width, nullptr, 0, nullptr, nullptr, f.mask + (shared0 + i) * width, factor, width,
                  x.data(), nullptr, m + i * width, true, false);
        }
        if (f.probs) std::memcpy(f.probs + offset + head * head_stride, m, n * sizeof(float));
      }
      gemm(false, false, heads, n, heads, 1.0f, post, heads, mixed, stride, 0.0f, weights + offset, head_stride);
      for (int64_t head = 0; f.keep && head < heads; ++head) {
        float* w = weights + offset + head * head_stride;
        apply_keep(f.keep + offset + head * head_stride, dropped_scale, n, w);
      }
    }
  });
  // 3. Per (batch, chunk, head): context = weights @ values.
  at::parallel_for(0, f.batch * chunks * heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t head = task % heads, c = (task / heads) % chunks, b = task / heads / chunks;
      const int64_t first = c * chunk, count = std::min(chunk, f.rows - first);
      const float* w = weights + ((b * heads + head) * f.rows + first) * width;
      float* out = f.context.at(b, head, first);
      gemm(false, false, count, f.size, f.pieces.first_rows, 1.0f, w, width, f.v1.at(b, head, 0), f.v1.row_stride,
           0.0f, out, f.context.row_stride);
      gemm(false, false, count, f.size, f.pieces.second_rows, 1.0f, w + f.pieces.first_width, width,
           f.v2.at(b, head, 0), f.v2.row_stride, 1.0f, out, f.context.row_stride);
    }
  });
}

}  // namespace

// One softmax from the scores to the context, a chunk of one head's queries per task (attention.h).
// The weights are written normalised where they are kept (probs_out, for autograd); otherwise each
// context row is scaled by 1 / its sum instead.
void attention_forward(const at::Tensor& query, double query_scale, const at::Tensor& first_keys,
                       const at::Tensor& first_values, int64_t window_block, const at::Tensor& second_keys,
                       const at::Tensor& second_values, const c10::optional<at::Tensor>& relative,
                       const c10::optional<at::Tensor>& ids, const c10::optional<at::Tensor>& carried,
                       const at::Tensor& mask_bias, double scale, const c10::optional<at::Tensor>& keep,
                       double keep_scale, const c10::optional<at::Tensor>& summed_out,
                       const c10::optional<at::Tensor>& probs_out, const at::Tensor& context_out,
                       const c10::optional<at::Tensor>& key_ranges) {
  const ForwardOperands f(query, first_keys, first_values, window_block, second_keys, second_values, relative, ids,
                          carried, mask_bias, keep, summed_out, probs_out, context_out);
  const int32_t* ranges = checked_ranges(key_ranges, f.batch, f.rows, window_block);
  const int64_t width = f.pieces.width;
  const float factor = static_cast<float>(scale), alpha = static_cast<float>(query_scale);
  const float dropped_scale = static_cast<float>(keep_scale);
  const RowFunction process = row_function(f.relative != nullptr, f.carried != nullptr, f.summed != nullptr,
                                           true);
  const int64_t chunk = ranges ? std::min<int64_t>(f.pieces.chunk(), kChunkWithRanges) : f.pieces.chunk();
  const int64_t chunks = (f.rows + chunk - 1) / chunk;

  // Heads innermost: consecutive tasks of a thread share the chunk's ids and mask.
  at::parallel_for(0, f.batch * chunks * f.heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(chunk * width), x(width), inverse_sums(chunk);
    CompactRow compact(ranges ? width : 0);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t head = task % f.heads, c = (task / f.heads) % chunks, b = task / f.heads / chunks;
      const int64_t first = c * chunk, count = std::min(chunk, f.rows - first);
      const float* query_rows = f.q.at(b, head, first);
      const auto span = f.pieces.keys_of(first);
      // The second keys the chunk's queries may see: the union of their rows' ranges (all without).
      const auto [low, high] = ranges ? chunk_range(ranges + 2 * (b * f.rows + first), count)
                                      : std::pair<int64_t, int64_t>{0, f.pieces.second_rows};
      const bool gaps = high - low < f.pieces.second_rows;
      const CompactRow::Layout layout{f.pieces.first_width, low, high};
      const int64_t used = layout.used();  // a row's columns in `scores`
      float* s = scores.data();
      f.pieces.zero_padding(span, count, s, used);
      gemm(false, true, count, span.end - span.begin, f.size, alpha, query_rows, f.q.row_stride,
           f.k1.at(b, head, span.begin), f.k1.row_stride, 0.0f, s + span.column, used);
      gemm(false, true, count, high - low, f.size, alpha, query_rows, f.q.row_stride, f.k2.at(b, head, low),
           f.k2.row_stride, 0.0f, s + f.pieces.first_width, used);

      // Weights kept for autograd are normalised; otherwise the context rows are scaled instead.
      const int64_t row0 = (b * f.heads + head) * f.rows + first, shared0 = b * f.rows + first;
      float* p = f.probs && !gaps ? f.probs + row0 * width : s;  // (the row pass may write over its scores)
      // Sums written to their own tensor (not over the carried scores, nor gathered) bypass the cache.
      const bool stream_summed = f.summed && f.summed != f.carried && !gaps;
      for (int64_t i = 0; i < count; ++i) {
        const int64_t row = row0 + i, shared = shared0 + i;
        const float* carried = f.carried ? f.carried + row * width : nullptr;
        const int32_t* row_ids = f.ids ? f.ids + shared * width : nullptr;
        const float* mask = f.mask + shared * width;
        const uint8_t* keep = f.keep ? f.keep + row * width : nullptr;
        float* summed = f.summed ? f.summed + row * width : nullptr;
        if (gaps) {  // the row's used columns gathered, so that the row pass reads them in one run
          carried = compact.gather(layout, carried, compact.carried);
          row_ids = compact.gather(layout, row_ids, compact.ids);
          mask = compact.gather(layout, mask, compact.mask);
          keep = compact.gather(layout, keep, compact.keep);
        }
        float* row_summed = gaps && summed ? compact.summed.data() : summed;
        inverse_sums[i] = process(
            s + i * used, f.relative ? f.relative + row * f.vocab : nullptr, f.vocab, row_ids, carried, mask, factor,
            used, x.data(), row_summed, p + i * used, f.probs != nullptr, stream_summed);
        if (gaps) {
          if (summed) layout.scatter(row_summed, summed);
          if (f.probs) layout.scatter(p + i * used, f.probs + row * width);
        }
        if (keep) drop(p + i * used, keep, dropped_scale, used, s + i * used);
      }
      const float* weights = f.keep || gaps ? s : p;
      const int64_t weights_stride = f.keep || gaps ? used : width;

      float* out = f.context.at(b, head, first);
      gemm(false, false, count, f.size, span.end - span.begin, 1.0f, weights + span.column, weights_stride,
           f.v1.at(b, head, span.begin), f.v1.row_stride, 0.0f, out, f.context.row_stride);
      gemm(false, false, count, f.size, high - low, 1.0f, weights + f.pieces.first_width, weights_stride,
           f.v2.at(b, head, low), f.v2.row_stride, 1.0f, out, f.context.row_stride);
      if (!f.probs) {
        for (int64_t i = 0; i < count; ++i) {
          for (int64_t j = 0; j < f.size; ++j) out[i * f.context.row_stride + j] *= inverse_sums[i];
        }
      }
    }
#if defined(__AVX512F__)
    _mm_sfence();  // the streamed sums visible before the loop ends
#endif
  });
}

// Talking heads (Shazeer et al., 2020): the heads' summed scores are mixed by `pre` [h, h] before
// the softmax and its weights by `post` after it, so a task holds all heads of a chunk of queries:
//   summed[h] = alpha q.k + relative + carried   (per head, as above; kept for the backward)
//   probs[h'] = softmax(scale * sum_h pre[h', h] summed[h] + mask)
//   weights[h''] = sum_h' post[h'', h'] probs[h'] (then dropout), context = weights @ values.
// The mixes are GEMMs over the chunk's scores: [h, h] @ [h, chunk x N]. With `key_ranges` (global
// queries under hard g2l, see chunk_range) a chunk of 16 queries scores only the union of its rows'
// second keys, in compact rows of all heads that fit in cache; the mask is shared by the heads, so
// every mixed row is masked in the same skipped columns and their weights are exactly 0 in every
// head.
void talking_heads_forward(const at::Tensor& query, double query_scale, const at::Tensor& first_keys,
                           const at::Tensor& first_values, int64_t window_block, const at::Tensor& second_keys,
                           const at::Tensor& second_values, const c10::optional<at::Tensor>& relative,
                           const c10::optional<at::Tensor>& ids, const c10::optional<at::Tensor>& carried,
                           const at::Tensor& mask_bias, double scale, const at::Tensor& pre, const at::Tensor& post,
                           const c10::optional<at::Tensor>& keep, double keep_scale,
                           const c10::optional<at::Tensor>& summed_out, const c10::optional<at::Tensor>& probs_out,
                           const at::Tensor& context_out, const c10::optional<at::Tensor>& key_ranges) {
  const ForwardOperands f(query, first_keys, first_values, window_block, second_keys, second_values, relative, ids,
                          carried, mask_bias, keep, summed_out, probs_out, context_out);
  const int32_t* ranges = checked_ranges(key_ranges, f.batch, f.rows, window_block);
  const int64_t width = f.pieces.width;
  check_mix(pre, "pre", f.heads);
  check_mix(post, "post", f.heads);
  const float* pre_data = pre.data_ptr<float>();
  const float* post_data = post.data_ptr<float>();
  const float factor = static_cast<float>(scale), alpha = static_cast<float>(query_scale);
  const float dropped_scale = static_cast<float>(keep_scale);
  if (window_block == 0 && !ranges) {
    return talking_heads_in_passes(f, alpha, factor, pre_data, post_data, dropped_scale);
  }
  const bool sums = f.relative != nullptr || f.carried != nullptr;
  const RowFunction add_terms = row_function(f.relative != nullptr, f.carried != nullptr, true, false);
  const RowFunction softmax = row_function(false, false, false, true);
  const Chunks parts(f.pieces, f.heads, f.rows, ranges ? kChunkWithRanges : f.rows);
  const int64_t chunk = parts.rows, stride = chunk * width, head_stride = f.rows * width;

  at::parallel_for(0, f.batch * parts.count, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores_buffer(f.heads * stride), mixed_buffer(f.heads * stride), x(width);
    std::vector<float> shared_mask(ranges ? stride : 0);
    std::vector<int32_t> shared_ids(ranges ? stride : 0);
    CompactRow compact(ranges ? width : 0);
    float* scores = scores_buffer.data();
    float* mixed = mixed_buffer.data();
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / parts.count;
      const auto [first, count, span] = parts.at(task % parts.count);
      const int64_t shared0 = b * f.rows + first, offset = (b * f.heads * f.rows + first) * width;
      const auto [low, high] = ranges ? chunk_range(ranges + 2 * shared0, count)
                                      : std::pair<int64_t, int64_t>{0, f.pieces.second_rows};
      const bool gaps = high - low < f.pieces.second_rows;
      const CompactRow::Layout layout{f.pieces.first_width, low, high};
      const int64_t used = layout.used(), n = count * used;  // a row's columns, a head's
      // The mask and ids of the chunk's rows, shared by the heads: in place, or gathered once.
      const float* mask = f.mask + shared0 * width;
      const int32_t* row_ids = f.ids ? f.ids + shared0 * width : nullptr;
      if (gaps) {
        mask = layout.gather_rows(mask, count, width, shared_mask.data());
        row_ids = layout.gather_rows(row_ids, count, width, shared_ids.data());
      }
      // Per head: the scores, and their sum with the relative terms and the carried scores, written
      // where they are kept (summed_out, when its rows are the chunk's) or in place.
      const bool sums_in_place = !f.summed || gaps;
      float* sums_at = sums_in_place ? scores : f.summed + offset;
      const int64_t sums_stride = sums_in_place ? stride : head_stride;
      for (int64_t head = 0; head < f.heads; ++head) {
        float* s = scores + head * stride;
        const float* query_rows = f.q.at(b, head, first);
        f.pieces.zero_padding(span, count, s, used);
        gemm(false, true, count, span.end - span.begin, f.size, alpha, query_rows, f.q.row_stride,
             f.k1.at(b, head, span.begin), f.k1.row_stride, 0.0f, s + span.column, used);
        gemm(false, true, count, high - low, f.size, alpha, query_rows, f.q.row_stride, f.k2.at(b, head, low),
             f.k2.row_stride, 0.0f, s + f.pieces.first_width, used);
        for (int64_t i = 0; i < count && (sums || f.summed); ++i) {
          const int64_t row = (b * f.heads + head) * f.rows + first + i;
          const float* carried = f.carried ? f.carried + row * width : nullptr;
          if (gaps) carried = compact.gather(layout, carried, compact.carried);
          float* summed = sums_at + head * sums_stride + i * used;
          add_terms(s + i * used, f.relative ? f.relative + row * f.vocab : nullptr, f.vocab,
                    row_ids ? row_ids + i * used : nullptr, carried, nullptr, 1.0f, used, x.data(), summed, nullptr,
                    false, false);
          if (gaps && f.summed) layout.scatter(summed, f.summed + row * width);
        }
      }
      // The mixes as GEMMs over the chunk: [h, h] @ [h, chunk x N] (measured faster than mixing
      // query by query in L1).
      gemm(false, false, f.heads, n, f.heads, 1.0f, pre_data, f.heads, sums_at, sums_stride, 0.0f, mixed, stride);
      for (int64_t head = 0; head < f.heads; ++head) {
        float* m = mixed + head * stride;
        for (int64_t i = 0; i < count; ++i) {
          softmax(m + i * used, nullptr, 0, nullptr, nullptr, mask + i * used, factor, used, x.data(), nullptr,
                  m + i * used, true, false);
          if (f.probs && gaps) layout.scatter(m + i * used, f.probs + offset + head * head_stride + i * width);
        }
        if (f.probs && !gaps) std::memcpy(f.probs + offset + head * head_stride, m, n * sizeof(float));
      }
      float* weights = scores;  // (the scores are spent)
      gemm(false, false, f.heads, n, f.heads, 1.0f, post_data, f.heads, mixed, stride, 0.0f, weights, stride);
      for (int64_t head = 0; head < f.heads; ++head) {
        float* w = weights + head * stride;
        for (int64_t i = 0; f.keep && i < count; ++i) {
          const uint8_t* kept = f.keep + offset + head * head_stride + i * width;
          if (gaps) kept = compact.gather(layout, kept, compact.keep);
          apply_keep(kept, dropped_scale, used, w + i * used);
        }
        float* out = f.context.at(b, head, first);
        gemm(false, false, count, f.size, span.end - span.begin, 1.0f, w + span.column, used,
             f.v1.at(b, head, span.begin), f.v1.row_stride, 0.0f, out, f.context.row_stride);
        gemm(false, false, count, f.size, high - low, 1.0f, w + f.pieces.first_width, used, f.v2.at(b, head, low),
             f.v2.row_stride, 1.0f, out, f.context.row_stride);
      }
    }
  });
}

}  // namespace longdoc::attention
