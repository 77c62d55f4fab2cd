// The forward of one softmax of global-local attention (see attention.h): attention_forward, and
// talking_heads_forward with the heads' mixes on either side of the softmax.

#include <ATen/Parallel.h>

#include <array>
#include <cmath>
#include <utility>

#include "attention.h"
#include "products.h"
#include "vectors.h"

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
#elif defined(LONGDOC_VECTORS)
// The AVX2 forms of the above, 8 columns at a time, where the compiler's vectorisation of the
// portable loops gathers the relative terms (vgatherdps) and keeps exp_approx's branches as
// comparisons and blends: with them the rows of the global softmax with carried scores ran 1.8x
// faster in the AVX2 build (AMD EPYC Zen 5 at ATEN_CPU_CAPABILITY=avx2, one thread, 4096 tokens).

// A row's relative terms, table[id], from at most 8 kParts terms held in kParts registers: each
// register permuted by the ids' low 3 bits, then the permutes blended by their bits 3, 4 (and 5).
template <int kParts>
struct SmallTable {
  static constexpr int64_t kMaxVocab = 8 * kParts;
  __m256 part[kParts];

  SmallTable(const float* table, int64_t vocab) {
    for (int64_t j = 0; j < kParts; ++j) part[j] = Avx2::masked_load(table + 8 * j, Avx2::first_lanes(vocab - 8 * j));
  }

  __m256 operator()(__m256i ids) const {
    __m256 level[kParts];
    for (int j = 0; j < kParts; ++j) level[j] = _mm256_permutevar8x32_ps(part[j], ids);
    int shift = 28;  // bit 3 of the ids into the sign bit, which the blend reads
    for (int n = kParts; n > 1; n /= 2, --shift) {
      const __m256 upper = _mm256_castsi256_ps(_mm256_slli_epi32(ids, shift));
      for (int j = 0; j < n / 2; ++j) level[j] = _mm256_blendv_ps(level[2 * j], level[2 * j + 1], upper);
    }
    return level[0];
  }
};

inline float reduce_max(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

inline float reduce_add(__m256 v) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
}

// first_pass_with_small_table of the AVX-512 build, 8 columns at a time (see there).
template <bool kCarry, bool kSummed, bool kSoftmax, int kParts>
int64_t first_pass_with_small_table(const float* s, const float* table, int64_t vocab, const int32_t* id,
                                    const float* carry, const float* mask, float factor, int64_t width, float* x,
                                    float* summed, bool stream, float* largest) {
  const SmallTable<kParts> lookup(table, vocab);
  const __m256 scale = _mm256_set1_ps(factor);
  __m256 top = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const auto columns = [&](int64_t c, const __m256i* lanes, bool streamed) {
    const __m256i ids = lanes ? _mm256_maskload_epi32(id + c, *lanes)
                              : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(id + c));
    __m256 value = _mm256_add_ps(lanes ? Avx2::masked_load(s + c, *lanes) : Avx2::load(s + c), lookup(ids));
    if (kCarry) {
      _mm_prefetch(reinterpret_cast<const char*>(carry + c + 2048), _MM_HINT_T0);
      value = _mm256_add_ps(value, lanes ? Avx2::masked_load(carry + c, *lanes) : Avx2::load(carry + c));
    }
    if (kSummed && streamed) _mm256_stream_ps(summed + c, value);
    if (kSummed && !streamed) lanes ? Avx2::masked_store(summed + c, value, *lanes) : Avx2::store(summed + c, value);
    if (kSoftmax) {
      value = _mm256_fmadd_ps(scale, value, lanes ? Avx2::masked_load(mask + c, *lanes) : Avx2::load(mask + c));
      lanes ? Avx2::masked_store(x + c, value, *lanes) : Avx2::store(x + c, value);
      const __m256 higher = _mm256_max_ps(top, value);
      top = lanes ? _mm256_blendv_ps(top, higher, _mm256_castsi256_ps(*lanes)) : higher;
    }
  };
  int64_t c = 0;
  if (kSummed && stream) {  // the columns before the first 32-byte boundary, masked
    c = std::min<int64_t>(width, (32 - reinterpret_cast<uintptr_t>(summed) % 32) % 32 / sizeof(float));
    if (c > 0) {
      const __m256i lanes = Avx2::first_lanes(c);
      columns(0, &lanes, false);
    }
  }
  for (; c + 8 <= width; c += 8) columns(c, nullptr, kSummed && stream);
  if (kSoftmax) *largest = std::max(*largest, reduce_max(top));
  return c;
}

// exp_approx on 8 lanes (see exp_vector of the AVX-512 build): 2^n from n's bits.
inline __m256 exp_vector(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(Cephes::kLowest);
  const __m256 clamped = _mm256_min_ps(_mm256_set1_ps(Cephes::kHighest), _mm256_max_ps(lowest, x));
  const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(clamped, _mm256_set1_ps(Cephes::kLog2e), _mm256_set1_ps(0.5f)));
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(Cephes::kLn2High), clamped);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(Cephes::kLn2Low), r);
  __m256 p = _mm256_set1_ps(Cephes::kPolynomial[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(Cephes::kPolynomial[i]));
  p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 above = _mm256_cmp_ps(x, lowest, _CMP_NLT_UQ);  // (NaN included)
  return _mm256_and_ps(above, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}

// The softmax's numerators exp(x - largest) of a row into probs, the last vector masked; returns their sum.
float exponentials(const float* x, float largest, int64_t width, float* probs) {
  const __m256 shift = _mm256_set1_ps(largest);
  __m256 total = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 8 <= width; c += 8) {
    const __m256 numerator = exp_vector(_mm256_sub_ps(Avx2::load(x + c), shift));
    Avx2::store(probs + c, numerator);
    total = _mm256_add_ps(total, numerator);
  }
  if (c < width) {
    const __m256i lanes = Avx2::first_lanes(width - c);
    const __m256 numerator = _mm256_and_ps(_mm256_castsi256_ps(lanes),
                                           exp_vector(_mm256_sub_ps(Avx2::masked_load(x + c, lanes), shift)));
    Avx2::masked_store(probs + c, numerator, lanes);
    total = _mm256_add_ps(total, numerator);
  }
  return reduce_add(total);
}
#endif

// One row of `one_row`, `width` columns: what it reads (null: a term the row does not have) and
// where it writes. summed and probs may be scores or carried (each row is read before it is written).
struct Row {
  const float* scores;                 // alpha q.k
  const float* relative = nullptr;     // the row's relative terms of every id [vocab], picked by ids
  int64_t vocab = 0;
  const int32_t* ids = nullptr;
  const float* carried = nullptr;
  const float* mask = nullptr;         // the softmax's mask bias
  float scale = 1.0f;                  // multiplies the summed scores in the softmax
  int64_t width = 0;
  float* logits = nullptr;             // [width] scratch, in L1
  float* summed = nullptr;             // written where given
  float* probs = nullptr;              // the softmax's weights, or its numerators (normalize false)
  bool normalize = false;
  bool stream_summed = false;          // the sums bypass the cache (see first_pass_with_small_table)
};

// One row: summed = scores + relative[ids] + carried (the terms present; stored unless summed is
// null), then probs = softmax(scale * summed + mask), or without `normalize` its numerators
// exp(.. - max), returning 1 / their sum (the caller scales what it computes from them: d numbers,
// not N). A template per combination of terms, so that the first loop has no branches: it reads the
// row's inputs once into the logits (in L1). Its pointers restrict-qualified and outside the
// parallel loop's closure, so that every loop vectorises.
template <bool kRelative, bool kCarry, bool kSummed, bool kSoftmax>
float one_row(const Row& row) {
  const float* s = row.scores;
  const float* __restrict table = row.relative;
  const int32_t* __restrict id = row.ids;
  const float* carry = row.carried;
  const float* __restrict mask = row.mask;
  float* __restrict x = row.logits;
  float* summed = row.summed;
  float* probs = row.probs;
  const float factor = row.scale;
  const int64_t width = row.width, vocab = row.vocab;
  float largest = -std::numeric_limits<float>::infinity();
  int64_t start = 0;  // columns the first pass has done
#if defined(__AVX512F__)
  if (kRelative && vocab <= SmallTable::kMaxVocab) {
    start = first_pass_with_small_table<kCarry, kSummed || !kSoftmax, kSoftmax>(s, table, vocab, id, carry, mask,
                                                                               factor, width, x, summed,
                                                                               row.stream_summed, &largest);
  }
#elif defined(LONGDOC_VECTORS)
  if (kRelative && vocab <= SmallTable<4>::kMaxVocab) {
    start = first_pass_with_small_table<kCarry, kSummed || !kSoftmax, kSoftmax, 4>(
        s, table, vocab, id, carry, mask, factor, width, x, summed, row.stream_summed, &largest);
  } else if (kRelative && vocab <= SmallTable<8>::kMaxVocab) {
    start = first_pass_with_small_table<kCarry, kSummed || !kSoftmax, kSoftmax, 8>(
        s, table, vocab, id, carry, mask, factor, width, x, summed, row.stream_summed, &largest);
  }
#endif
  if (!kSoftmax) {  // the sum alone (talking heads mix the heads before their softmax)
#pragma omp simd
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
#if defined(LONGDOC_VECTORS)
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
  if (row.normalize) {
#pragma omp simd
    for (int64_t c = 0; c < width; ++c) probs[c] *= inverse;
  }
  return inverse;
}

using RowFunction = float (*)(const Row&);

// Which one_row a pass runs: the terms its rows have, whether it writes the sums, whether it takes
// the softmax (talking heads sum the terms first and mix the heads before their softmax).
struct RowTerms {
  bool relative = false, carried = false, summed = false, softmax = false;

  int index() const { return 8 * relative + 4 * carried + 2 * summed + softmax; }
};

// one_row for every RowTerms, by index().
template <size_t... kIndex>
constexpr std::array<RowFunction, sizeof...(kIndex)> one_rows(std::index_sequence<kIndex...>) {
  return {one_row<(kIndex & 8) != 0, (kIndex & 4) != 0, (kIndex & 2) != 0, (kIndex & 1) != 0>...};
}

RowFunction row_function(const RowTerms& terms) {
  static constexpr auto kRows = one_rows(std::make_index_sequence<16>());
  return kRows[terms.index()];
}

// A forward's operands (ForwardOperands, attention.h), checked: row views of the [B, h, N, d]
// tensors, pointers to the others (null where not given), and the scalars as floats.
struct CheckedForward {
  int64_t batch, heads, rows, size, vocab = 0;
  Pieces pieces;
  Rows<const float> q, k1, v1, k2, v2;
  Rows<float> context;
  float alpha, factor, dropped_scale;  // query_scale, scale, keep_scale
  const float* relative = nullptr;
  const int32_t* ids = nullptr;
  const float* carried = nullptr;
  const float* mask = nullptr;
  const uint8_t* keep = nullptr;
  float* summed = nullptr;
  float* probs = nullptr;
  const int32_t* ranges = nullptr;

  explicit CheckedForward(const ForwardOperands& o)
      : batch(o.query.size(0)), heads(o.query.size(1)), rows(o.query.size(2)), size(o.query.size(3)),
        pieces(o.window_block, o.first_keys.size(2), o.second_keys.size(2)), q(checked(o.query, "query", o.query)),
        k1(checked(o.first_keys, "first_keys", o.query)), v1(checked(o.first_values, "first_values", o.query)),
        k2(checked(o.second_keys, "second_keys", o.query)), v2(checked(o.second_values, "second_values", o.query)),
        context(checked(o.context_out, "context_out", o.query)), alpha(static_cast<float>(o.query_scale)),
        factor(static_cast<float>(o.scale)), dropped_scale(static_cast<float>(o.keep_scale)) {
    check_shapes(o);
    if (o.relative.has_value()) {
      vocab = o.relative->size(3);
      relative = o.relative->data_ptr<float>();
      ids = o.ids->data_ptr<int32_t>();
    }
    carried = data_or_null(o.carried);
    mask = o.mask_bias.data_ptr<float>();
    keep = o.keep.has_value() ? o.keep->data_ptr<uint8_t>() : nullptr;
    summed = o.summed_out.has_value() ? o.summed_out->data_ptr<float>() : nullptr;
    probs = o.probs_out.has_value() ? o.probs_out->data_ptr<float>() : nullptr;
    ranges = checked_ranges(o.key_ranges, batch, rows, o.window_block);
  }

  void check_shapes(const ForwardOperands& o) const {
    const int64_t width = pieces.width;
    check_values(o.first_keys, o.first_values, o.second_keys, o.second_values);
    TORCH_CHECK(o.context_out.size(2) == rows, "context_out must have the query's ", rows, " rows, not ",
                o.context_out.size(2));
    check(o.mask_bias, "mask_bias", at::kFloat, 3);
    TORCH_CHECK(o.mask_bias.sizes() == at::IntArrayRef({batch, rows, width}), "mask_bias must be [B, M, N] = [",
                batch, ", ", rows, ", ", width, "], not ", o.mask_bias.sizes());
    check_scores(o.carried, "carried", o.query, width);
    check_scores(o.summed_out, "summed_out", o.query, width);
    check_scores(o.probs_out, "probs_out", o.query, width);
    check_scores(o.keep, "keep", o.query, width, at::kByte);
    TORCH_CHECK(!o.keep.has_value() || o.probs_out.has_value(), "dropout's keep mask comes with probs_out");
    TORCH_CHECK(o.relative.has_value() == o.ids.has_value(), "relative and ids come together");
    if (o.relative.has_value()) {
      check(*o.relative, "relative", at::kFloat, 4);
      check(*o.ids, "ids", at::kInt, 3);
      TORCH_CHECK(o.relative->size(2) == rows, "relative must be [B, h, M, R] with M = ", rows, ", not ",
                  o.relative->sizes());
      TORCH_CHECK(o.ids->sizes() == o.mask_bias.sizes(), "ids must be [B, M, N] like mask_bias ",
                  o.mask_bias.sizes(), ", not ", o.ids->sizes());
    }
  }

  // The relative terms and carried scores of per-head row `row` of [B, h, M, ..], and the ids of
  // shared row `shared` of [B, M, N] (null without them).
  const float* relative_row(int64_t row) const { return relative ? relative + row * vocab : nullptr; }
  const float* carried_row(int64_t row) const { return carried ? carried + row * pieces.width : nullptr; }
  const int32_t* ids_row(int64_t shared) const { return ids ? ids + shared * pieces.width : nullptr; }
  // The rows' terms, summed and written without the softmax (talking heads' first step), or with it.
  RowTerms sum_of_terms() const {
    return {.relative = relative != nullptr, .carried = carried != nullptr, .summed = true};
  }
  RowTerms softmax_of_sum() const {
    return {.relative = relative != nullptr, .carried = carried != nullptr, .summed = summed != nullptr,
            .softmax = true};
  }

  static const at::Tensor& checked(const at::Tensor& tensor, const char* name, const at::Tensor& query) {
    check_rows(tensor, name, query);
    return tensor;
  }

  // The first and second keys, values or context rows of the chunk `keys` of head `head` in entry `b`.
  const float* first_keys(const ChunkKeys& keys, int64_t b, int64_t head) const {
    return k1.at(b, head, keys.span.begin);
  }
  const float* second_keys(const ChunkKeys& keys, int64_t b, int64_t head) const {
    return k2.at(b, head, keys.layout.low);
  }
  // The chunk's scores of head `head` into `out` (rows of keys.used() columns).
  void scores(const ChunkKeys& keys, int64_t b, int64_t head, float* out) const {
    products_with_keys(pieces, keys, size, alpha, q.at(b, head, keys.first), q.row_stride, first_keys(keys, b, head),
                       k1.row_stride, second_keys(keys, b, head), k2.row_stride, out);
  }
  // The chunk's context of head `head` from its weights (rows `stride` apart).
  void context_of(const ChunkKeys& keys, int64_t b, int64_t head, const float* weights, int64_t stride) const {
    weighted_values(pieces, keys, size, weights, stride, v1.at(b, head, keys.span.begin), v1.row_stride,
                    v2.at(b, head, keys.layout.low), v2.row_stride, context.at(b, head, keys.first), context.row_stride);
  }
};

// Talking heads without a window (the global queries) in three passes, so that the q.k and weights
// @ values GEMMs run per head over 128 queries as without talking heads, rather than over the few
// queries whose scores of all heads fit in cache (they read all the long keys and values each
// time). The summed scores and the weights make a round trip through memory instead (53 MB each at
// 4096 tokens).
struct TalkingHeadsInPasses {
  const CheckedForward& f;
  const float* pre;
  const float* post;
  float* sums;  // [B, h, M, N]: summed_out, or a buffer of this forward's
  float* weights;  // [B, h, M, N]

  // 1. Per (batch, chunk, head): the summed scores, into memory.
  void sum_scores() const {
    const int64_t width = f.pieces.width, heads = f.heads;
    const bool terms = f.relative != nullptr || f.carried != nullptr;
    const RowFunction add_terms = row_function(f.sum_of_terms());
    const int64_t chunk = f.pieces.chunk(), chunks = (f.rows + chunk - 1) / chunk;
    at::parallel_for(0, f.batch * chunks * heads, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> x(width);
      for (int64_t task = begin; task < end; ++task) {
        const int64_t head = task % heads, c = (task / heads) % chunks, b = task / heads / chunks;
        const int64_t first = c * chunk, count = std::min(chunk, f.rows - first);
        const int64_t row0 = (b * heads + head) * f.rows + first;
        float* s = sums + row0 * width;
        f.scores(ChunkKeys(f.pieces, nullptr, f.rows, b, first, count), b, head, s);
        for (int64_t i = 0; terms && i < count; ++i) {
          add_terms({.scores = s + i * width, .relative = f.relative_row(row0 + i), .vocab = f.vocab,
                     .ids = f.ids_row(b * f.rows + first + i), .carried = f.carried_row(row0 + i), .width = width,
                     .logits = x.data(), .summed = s + i * width});
        }
      }
    });
  }

  // 2. Per (batch, group of queries), all heads in cache: mix, softmax, mix, dropout -> weights.
  void mix_and_softmax() const {
    const int64_t width = f.pieces.width, head_stride = f.rows * width, heads = f.heads;
    const RowFunction softmax = row_function({.softmax = true});
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
            softmax({.scores = m + i * width, .mask = f.mask + (shared0 + i) * width, .scale = f.factor,
                     .width = width, .logits = x.data(), .probs = m + i * width, .normalize = true});
          }
          if (f.probs) std::memcpy(f.probs + offset + head * head_stride, m, n * sizeof(float));
        }
        gemm(false, false, heads, n, heads, 1.0f, post, heads, mixed, stride, 0.0f, weights + offset, head_stride);
        for (int64_t head = 0; f.keep && head < heads; ++head) {
          float* w = weights + offset + head * head_stride;
          apply_keep(f.keep + offset + head * head_stride, f.dropped_scale, n, w);
        }
      }
    });
  }

  // 3. Per (batch, chunk, head): context = weights @ values.
  void weigh_values() const {
    const int64_t width = f.pieces.width, heads = f.heads;
    const int64_t chunk = f.pieces.chunk(), chunks = (f.rows + chunk - 1) / chunk;
    at::parallel_for(0, f.batch * chunks * heads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t head = task % heads, c = (task / heads) % chunks, b = task / heads / chunks;
        const int64_t first = c * chunk, count = std::min(chunk, f.rows - first);
        const float* w = weights + ((b * heads + head) * f.rows + first) * width;
        f.context_of(ChunkKeys(f.pieces, nullptr, f.rows, b, first, count), b, head, w, width);
      }
    });
  }
};

void talking_heads_in_passes(const CheckedForward& f, const float* pre, const float* post) {
  const int64_t size = f.batch * f.heads * f.rows * f.pieces.width;
  at::Tensor own_sums, weights = at::empty({size}, at::kFloat);
  float* sums = f.summed;
  if (!sums) {
    own_sums = at::empty({size}, at::kFloat);
    sums = own_sums.data_ptr<float>();
  }
  const TalkingHeadsInPasses passes{f, pre, post, sums, weights.data_ptr<float>()};
  passes.sum_scores();
  passes.mix_and_softmax();
  passes.weigh_values();
}

// What a task of attention_forward keeps from chunk to chunk: the chunk's scores (the row pass may
// write the weights over them), a row's logits, each row's 1 / sum of its softmax's numerators, and
// the compact rows of key ranges.
struct PlainForwardBuffers {
  std::vector<float> scores, x, inverse_sums;
  CompactRow compact;

  PlainForwardBuffers(int64_t chunk, int64_t width, bool ranges)
      : scores(chunk * width), x(width), inverse_sums(chunk), compact(ranges ? width : 0) {}
};

// The row pass of a chunk of one head (rows row0 .. in [B, h, M, N]): summed scores, softmax into
// p (normalised where the weights are kept), dropout into s; with gaps, each row's used columns
// gathered first and its outputs scattered back.
void plain_row_pass(const CheckedForward& f, RowFunction process, const ChunkKeys& keys, int64_t b, int64_t row0,
                    float* s, float* p, PlainForwardBuffers& buffers) {
  const int64_t width = f.pieces.width, used = keys.used(), shared0 = b * f.rows + keys.first;
  const CompactRow::Layout& layout = keys.layout;
  CompactRow& compact = buffers.compact;
  // Sums written to their own tensor (not over the carried scores, nor gathered) bypass the cache.
  const bool stream_summed = f.summed && f.summed != f.carried && !keys.gaps;
  for (int64_t i = 0; i < keys.count; ++i) {
    const int64_t row = row0 + i, shared = shared0 + i;
    const float* carried = f.carried_row(row);
    const int32_t* row_ids = f.ids_row(shared);
    const float* mask = f.mask + shared * width;
    const uint8_t* keep = f.keep ? f.keep + row * width : nullptr;
    float* summed = f.summed ? f.summed + row * width : nullptr;
    if (keys.gaps) {  // the row's used columns gathered, so that the row pass reads them in one run
      carried = compact.gather(layout, carried, compact.carried);
      row_ids = compact.gather(layout, row_ids, compact.ids);
      mask = compact.gather(layout, mask, compact.mask);
      keep = compact.gather(layout, keep, compact.keep);
    }
    float* row_summed = keys.gaps && summed ? compact.summed.data() : summed;
    buffers.inverse_sums[i] = process({.scores = s + i * used, .relative = f.relative_row(row), .vocab = f.vocab,
                                       .ids = row_ids, .carried = carried, .mask = mask, .scale = f.factor,
                                       .width = used, .logits = buffers.x.data(), .summed = row_summed,
                                       .probs = p + i * used, .normalize = f.probs != nullptr,
                                       .stream_summed = stream_summed});
    if (keys.gaps) {
      if (summed) layout.scatter(row_summed, summed);
      if (f.probs) layout.scatter(p + i * used, f.probs + row * width);
    }
    if (keep) drop(p + i * used, keep, f.dropped_scale, used, s + i * used);
  }
}

// One chunk of one head's queries: scores, the row pass, the context (scaled by the rows' 1 / sums
// where the weights are not kept normalised).
void plain_forward_chunk(const CheckedForward& f, RowFunction process, const ChunkKeys& keys, int64_t b, int64_t head,
                         PlainForwardBuffers& buffers) {
  const int64_t width = f.pieces.width, used = keys.used();
  float* s = buffers.scores.data();
  f.scores(keys, b, head, s);
  // Weights kept for autograd are normalised; otherwise the context rows are scaled instead.
  const int64_t row0 = (b * f.heads + head) * f.rows + keys.first;
  float* p = f.probs && !keys.gaps ? f.probs + row0 * width : s;  // (the row pass may write over its scores)
  plain_row_pass(f, process, keys, b, row0, s, p, buffers);
  const bool compact_weights = f.keep || keys.gaps;
  f.context_of(keys, b, head, compact_weights ? s : p, compact_weights ? used : width);
  if (!f.probs) {
    float* out = f.context.at(b, head, keys.first);
    for (int64_t i = 0; i < keys.count; ++i) {
      for (int64_t j = 0; j < f.size; ++j) out[i * f.context.row_stride + j] *= buffers.inverse_sums[i];
    }
  }
}

// What a task of talking_heads_forward keeps from chunk to chunk: all heads' scores of the chunk
// (then their weights) and their mixed logits (then the softmax's weights), a row's logits, and
// under key ranges the chunk's mask and ids gathered and the compact rows.
struct TalkingForwardBuffers {
  std::vector<float> scores, mixed, x, shared_mask;
  std::vector<int32_t> shared_ids;
  CompactRow compact;

  TalkingForwardBuffers(int64_t heads, int64_t stride, int64_t width, bool ranges)
      : scores(heads * stride), mixed(heads * stride), x(width), shared_mask(ranges ? stride : 0),
        shared_ids(ranges ? stride : 0), compact(ranges ? width : 0) {}
};

// talking_heads_forward's chunks of queries, all heads at once (see there).
struct TalkingForward {
  const CheckedForward& f;
  const float* pre;
  const float* post;
  int64_t stride;  // between heads' rows in the buffers
  RowFunction add_terms = nullptr, softmax = nullptr;

  TalkingForward(const CheckedForward& f, const float* pre, const float* post, int64_t stride)
      : f(f), pre(pre), post(post), stride(stride),
        add_terms(row_function(f.sum_of_terms())), softmax(row_function({.softmax = true})) {}

  // Per head: the scores, and their sum with the relative terms and the carried scores, written
  // where they are kept (summed_out, when its rows are the chunk's) or in place; returns where the
  // sums lie and their stride between heads.
  std::pair<float*, int64_t> sum_scores(const ChunkKeys& keys, int64_t b, const int32_t* row_ids,
                                        TalkingForwardBuffers& buffers) const {
    const int64_t width = f.pieces.width, used = keys.used(), offset = (b * f.heads * f.rows + keys.first) * width;
    const bool sums = f.relative != nullptr || f.carried != nullptr;
    const bool sums_in_place = !f.summed || keys.gaps;
    float* scores = buffers.scores.data();
    float* sums_at = sums_in_place ? scores : f.summed + offset;
    const int64_t sums_stride = sums_in_place ? stride : f.rows * width;
    for (int64_t head = 0; head < f.heads; ++head) {
      float* s = scores + head * stride;
      f.scores(keys, b, head, s);
      for (int64_t i = 0; i < keys.count && (sums || f.summed); ++i) {
        const int64_t row = (b * f.heads + head) * f.rows + keys.first + i;
        const float* carried = f.carried_row(row);
        if (keys.gaps) carried = buffers.compact.gather(keys.layout, carried, buffers.compact.carried);
        float* summed = sums_at + head * sums_stride + i * used;
        add_terms({.scores = s + i * used, .relative = f.relative_row(row), .vocab = f.vocab,
                   .ids = row_ids ? row_ids + i * used : nullptr, .carried = carried, .width = used,
                   .logits = buffers.x.data(), .summed = summed});
        if (keys.gaps && f.summed) keys.layout.scatter(summed, f.summed + row * width);
      }
    }
    return {sums_at, sums_stride};
  }

  // The mixes as GEMMs over the chunk: [h, h] @ [h, chunk x N] (measured faster than mixing query by
  // query in L1), the softmax between them: the weights into the scores' buffer (they are spent).
  void weigh(const ChunkKeys& keys, int64_t b, std::pair<float*, int64_t> sums, const float* mask,
             TalkingForwardBuffers& buffers) const {
    const int64_t width = f.pieces.width, used = keys.used(), n = keys.count * used, head_stride = f.rows * width;
    const int64_t offset = (b * f.heads * f.rows + keys.first) * width;
    float* mixed = buffers.mixed.data();
    gemm(false, false, f.heads, n, f.heads, 1.0f, pre, f.heads, sums.first, sums.second, 0.0f, mixed, stride);
    for (int64_t head = 0; head < f.heads; ++head) {
      float* m = mixed + head * stride;
      for (int64_t i = 0; i < keys.count; ++i) {
        softmax({.scores = m + i * used, .mask = mask + i * used, .scale = f.factor, .width = used,
                 .logits = buffers.x.data(), .probs = m + i * used, .normalize = true});
        if (f.probs && keys.gaps) keys.layout.scatter(m + i * used, f.probs + offset + head * head_stride + i * width);
      }
      if (f.probs && !keys.gaps) std::memcpy(f.probs + offset + head * head_stride, m, n * sizeof(float));
    }
    gemm(false, false, f.heads, n, f.heads, 1.0f, post, f.heads, mixed, stride, 0.0f, buffers.scores.data(), stride);
  }

  // Dropout on each head's weights, then context = weights @ values.
  void weigh_values(const ChunkKeys& keys, int64_t b, TalkingForwardBuffers& buffers) const {
    const int64_t width = f.pieces.width, used = keys.used(), head_stride = f.rows * width;
    const int64_t offset = (b * f.heads * f.rows + keys.first) * width;
    for (int64_t head = 0; head < f.heads; ++head) {
      float* w = buffers.scores.data() + head * stride;
      for (int64_t i = 0; f.keep && i < keys.count; ++i) {
        const uint8_t* kept = f.keep + offset + head * head_stride + i * width;
        if (keys.gaps) kept = buffers.compact.gather(keys.layout, kept, buffers.compact.keep);
        apply_keep(kept, f.dropped_scale, used, w + i * used);
      }
      f.context_of(keys, b, head, w, used);
    }
  }

  void chunk(const ChunkKeys& keys, int64_t b, TalkingForwardBuffers& buffers) const {
    const int64_t width = f.pieces.width, shared0 = b * f.rows + keys.first;
    // The mask and ids of the chunk's rows, shared by the heads: in place, or gathered once.
    const float* mask = f.mask + shared0 * width;
    const int32_t* row_ids = f.ids ? f.ids + shared0 * width : nullptr;
    if (keys.gaps) {
      mask = keys.layout.gather_rows(mask, keys.count, width, buffers.shared_mask.data());
      row_ids = keys.layout.gather_rows(row_ids, keys.count, width, buffers.shared_ids.data());
    }
    weigh(keys, b, sum_scores(keys, b, row_ids, buffers), mask, buffers);
    weigh_values(keys, b, buffers);
  }
};

}  // namespace

// One softmax from the scores to the context, a chunk of one head's queries per task (attention.h).
// The weights are written normalised where they are kept (probs_out, for autograd); otherwise each
// context row is scaled by 1 / its sum instead.
void attention_forward(const ForwardOperands& operands) {
  const CheckedForward f(operands);
  const RowFunction process = row_function(f.softmax_of_sum());
  const int64_t chunk = f.ranges ? std::min<int64_t>(f.pieces.chunk(), kChunkWithRanges) : f.pieces.chunk();
  const int64_t chunks = (f.rows + chunk - 1) / chunk;

  // Heads innermost: consecutive tasks of a thread share the chunk's ids and mask.
  at::parallel_for(0, f.batch * chunks * f.heads, 1, [&](int64_t begin, int64_t end) {
    PlainForwardBuffers buffers(chunk, f.pieces.width, f.ranges != nullptr);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t head = task % f.heads, c = (task / f.heads) % chunks, b = task / f.heads / chunks;
      const int64_t first = c * chunk, count = std::min(chunk, f.rows - first);
      plain_forward_chunk(f, process, ChunkKeys(f.pieces, f.ranges, f.rows, b, first, count), b, head, buffers);
    }
#if defined(LONGDOC_VECTORS)
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
void talking_heads_forward(const ForwardOperands& operands) {
  const CheckedForward f(operands);
  TORCH_CHECK(operands.pre.has_value() && operands.post.has_value(), "talking_heads_forward needs pre and post");
  check_mix(*operands.pre, "pre", f.heads);
  check_mix(*operands.post, "post", f.heads);
  const float* pre = operands.pre->data_ptr<float>();
  const float* post = operands.post->data_ptr<float>();
  if (operands.window_block == 0 && !f.ranges) return talking_heads_in_passes(f, pre, post);
  const Chunks parts(f.pieces, f.heads, f.rows, f.ranges ? kChunkWithRanges : f.rows);
  const TalkingForward plan(f, pre, post, parts.rows * f.pieces.width);

  at::parallel_for(0, f.batch * parts.count, 1, [&](int64_t begin, int64_t end) {
    TalkingForwardBuffers buffers(f.heads, plan.stride, f.pieces.width, f.ranges != nullptr);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / parts.count;
      const auto part = parts.at(task % parts.count);
      plan.chunk(ChunkKeys(f.pieces, f.ranges, f.rows, b, part.first, part.count), b, buffers);
    }
  });
}

}  // namespace longdoc::attention
