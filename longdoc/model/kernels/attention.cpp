// Global-local attention's compiled CPU kernels (float32): each softmax of a layer whole, from the
// projections to the context, forward and backward.
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
//
// The GEMMs are BLAS's sgemm, which torch's CPU build carries (MKL or OpenBLAS), called
// single-threaded inside the parallel loops; or, where `use_own_products(true)` was called (CPUs on
// which MKL keeps to its AVX2 code: longdoc.model.linear decides), this file's own AVX-512 code for
// the products attention has: q k^T over a head's d columns, and op(A) @ B (weights @ values).

#include <torch/extension.h>

#include <ATen/Parallel.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <utility>
#include <vector>

// BLAS's single-precision GEMM (column-major, Fortran calling convention), exported by torch's CPU build.
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);

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
// registers: two permutes and a blend, where the gather the compiler emits took 6 of the long
// softmax's 35 ms a layer at 4096 tokens.
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
// first read the line it overwrites (the long softmax's call writing its sums to a fresh tensor, as
// in training and in the first layer: 27.4 against 32.6 ms; written over the carried scores, whose
// lines were just read, the sums are stored as usual).
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
      // pages: fetched 8 KB ahead, the long softmax's call took 6-8% less (2048 floats; 512 to 4096
      // gave 5-8%). A prefetch never faults, past the tensor's end included.
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
// by scalef (the long softmax's call 10% faster at 4096 tokens).
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

const float* data_or_null(const c10::optional<at::Tensor>& tensor) {
  return tensor.has_value() ? tensor->data_ptr<float>() : nullptr;
}

void check(const at::Tensor& tensor, const char* name, at::ScalarType dtype, int64_t dims) {
  TORCH_CHECK(tensor.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(tensor.scalar_type() == dtype, name, " has the wrong dtype");
  TORCH_CHECK(tensor.dim() == dims, name, " must have ", dims, " dimensions");
  TORCH_CHECK(tensor.is_contiguous(), name, " must be contiguous");
}

// Whether gemm() runs attention's two shapes on the code below instead of BLAS (set once per process).
bool own_products = false;

#if defined(__AVX512F__)
// The products attention has, for a CPU whose BLAS keeps to AVX2: on one Zen 5 core MKL's sgemm ran
// the long softmax's q k^T (84 x 252, d = 32) at 92 GFLOP/s and its weights @ values at 94; these
// at about 180 and 260. Each keeps a tile of C in 24 registers and streams the other operand past it:
// q k^T over the keys packed transposed, op(A) @ B (weights @ values, the backward's products with a
// transposed A, talking heads' mixes) over B's rows as they lie.

// 16 rows of 16 floats -> their 16 columns, in registers.
inline void transpose16(__m512 r[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // u[4i + q], 128-bit lane l: column 4l + q of rows 4i .. 4i + 3
    u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int q = 0; q < 4; ++q) {
    const __m512 v0 = _mm512_shuffle_f32x4(u[q], u[4 + q], 0x88), v1 = _mm512_shuffle_f32x4(u[q], u[4 + q], 0xdd);
    const __m512 v2 = _mm512_shuffle_f32x4(u[8 + q], u[12 + q], 0x88), v3 = _mm512_shuffle_f32x4(u[8 + q], u[12 + q], 0xdd);
    r[q] = _mm512_shuffle_f32x4(v0, v2, 0x88);
    r[q + 4] = _mm512_shuffle_f32x4(v1, v3, 0x88);
    r[q + 8] = _mm512_shuffle_f32x4(v0, v2, 0xdd);
    r[q + 12] = _mm512_shuffle_f32x4(v1, v3, 0xdd);
  }
}

// A mask of the first `count` of 16 lanes (all for 16 or more, none for 0 or fewer).
inline __mmask16 first_lanes(int64_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << std::max<int64_t>(count, 0)) - 1);
}

// B [n, k] (row stride ldb) -> packed [k, np]: column j of the packed rows is row j of B.
void pack_transposed(const float* b, int64_t ldb, int64_t n, int64_t k, float* packed, int64_t np) {
  __m512 r[16];
  for (int64_t j = 0; j < n; j += 16) {
    const int64_t rows = std::min<int64_t>(16, n - j);
    for (int64_t depth = 0; depth < k; depth += 16) {
      const __mmask16 lanes = first_lanes(k - depth);
      for (int64_t i = 0; i < 16; ++i) {
        r[i] = i < rows ? _mm512_maskz_loadu_ps(lanes, b + (j + i) * ldb + depth) : _mm512_setzero_ps();
      }
      transpose16(r);
      for (int64_t q = 0; q < std::min<int64_t>(16, k - depth); ++q) _mm512_storeu_ps(packed + (depth + q) * np + j, r[q]);
    }
  }
}

// R rows of C [.., 16 V columns; with `Masked`, only the last vector's `last` lanes of its last 16] =
// alpha * op(A) [R, k] @ B [k, ..] (+ C where `accumulate`); op(A) = A, or A^T with A stored [k, R]
// (`TransposeA`). (Whole vectors take no masks: masked loads and stores there cost 15% of a forward.)
template <int V, int R, bool TransposeA, bool Masked>
inline void product_tile(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k, float alpha,
                         bool accumulate, float* c, int64_t ldc, __mmask16 last) {
  __m512 sum[R][V];
  for (int r = 0; r < R; ++r)
    for (int q = 0; q < V; ++q) sum[r][q] = _mm512_setzero_ps();
  for (int64_t depth = 0; depth < k; ++depth) {
    __m512 row[V];
    for (int q = 0; q < V; ++q) {
      row[q] = Masked && q == V - 1 ? _mm512_maskz_loadu_ps(last, b + depth * ldb + 16 * q)
                                    : _mm512_loadu_ps(b + depth * ldb + 16 * q);
    }
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(TransposeA ? a[depth * lda + r] : a[r * lda + depth]);
      for (int q = 0; q < V; ++q) sum[r][q] = _mm512_fmadd_ps(x, row[q], sum[r][q]);
    }
  }
  const __m512 scale = _mm512_set1_ps(alpha);
  for (int r = 0; r < R; ++r) {
    for (int q = 0; q < V; ++q) {
      float* out = c + r * ldc + 16 * q;
      const __m512 value = _mm512_mul_ps(sum[r][q], scale);
      if (Masked && q == V - 1) {
        _mm512_mask_storeu_ps(out, last, accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(last, out), value) : value);
      } else {
        _mm512_storeu_ps(out, accumulate ? _mm512_add_ps(_mm512_loadu_ps(out), value) : value);
      }
    }
  }
}

// Rows in tiles of R, the rest in tiles of R / 2, R / 4, ...
template <int V, int R, bool TransposeA, bool Masked>
void product_rows(int64_t m, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k, float alpha,
                  bool accumulate, float* c, int64_t ldc, __mmask16 last) {
  const int64_t row_step = TransposeA ? 1 : lda;  // from one row of op(A) to the next
  int64_t i = 0;
  for (; i + R <= m; i += R) {
    product_tile<V, R, TransposeA, Masked>(a + i * row_step, lda, b, ldb, k, alpha, accumulate, c + i * ldc, ldc,
                                           last);
  }
  if constexpr (R > 1) {
    if (i < m) product_rows<V, R / 2, TransposeA, Masked>(m - i, a + i * row_step, lda, b, ldb, k, alpha,
                                                         accumulate, c + i * ldc, ldc, last);
  }
}

// One block of up to 64 columns: V vectors, 24 / V rows at a time.
template <bool TransposeA, bool Masked>
void product_block(int64_t vectors, int64_t m, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k,
                   float alpha, bool accumulate, float* c, int64_t ldc, __mmask16 last) {
  switch (vectors) {
    case 1: product_rows<1, 24, TransposeA, Masked>(m, a, lda, b, ldb, k, alpha, accumulate, c, ldc, last); break;
    case 2: product_rows<2, 12, TransposeA, Masked>(m, a, lda, b, ldb, k, alpha, accumulate, c, ldc, last); break;
    case 3: product_rows<3, 8, TransposeA, Masked>(m, a, lda, b, ldb, k, alpha, accumulate, c, ldc, last); break;
    default: product_rows<4, 6, TransposeA, Masked>(m, a, lda, b, ldb, k, alpha, accumulate, c, ldc, last); break;
  }
}

// C [m, n] = alpha * op(A) [m, k] @ B [k, n] (+ C where `accumulate`).
template <bool TransposeA>
void own_gemm_nn(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                 int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  for (int64_t j = 0; j < n; j += 64) {
    const int64_t columns = std::min<int64_t>(64, n - j), vectors = (columns + 15) / 16;
    if (columns % 16 == 0) {
      product_block<TransposeA, false>(vectors, m, a, lda, b + j, ldb, k, alpha, accumulate, c + j, ldc, 0);
    } else {
      product_block<TransposeA, true>(vectors, m, a, lda, b + j, ldb, k, alpha, accumulate, c + j, ldc,
                                      first_lanes(columns % 16));
    }
  }
}

// C [m, n] = alpha * A [m, k] @ B [n, k]^T (q k^T): B packed transposed, then the product above.
void own_gemm_nt(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                 int64_t ldb, float* c, int64_t ldc) {
  thread_local std::vector<float> packed;
  const int64_t np = (n + 15) / 16 * 16;
  packed.resize(k * np);
  pack_transposed(b, ldb, n, k, packed.data(), np);
  own_gemm_nn<false>(m, n, k, alpha, a, lda, packed.data(), np, false, c, ldc);
}
#endif

// Row-major C[m, n] = alpha * op(A) @ op(B) + beta * C, op(A) [m, k] and op(B) [k, n], each matrix at
// its own row stride; `transpose_a`: A is stored [k, m] (op(A) = A^T), likewise B. BLAS is
// column-major, where row-major C is C^T = op(B)^T op(A)^T.
void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    if (beta == 0.0f) {
      for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    }
    return;
  }
#if defined(__AVX512F__)
  if (own_products && !transpose_a && transpose_b && beta == 0.0f && k <= 128) {  // k: a head's size
    own_gemm_nt(m, n, k, alpha, a, lda, b, ldb, c, ldc);
    return;
  }
  if (own_products && !transpose_b && (beta == 0.0f || beta == 1.0f)) {
    if (transpose_a) {
      own_gemm_nn<true>(m, n, k, alpha, a, lda, b, ldb, beta == 1.0f, c, ldc);
    } else {
      own_gemm_nn<false>(m, n, k, alpha, a, lda, b, ldb, beta == 1.0f, c, ldc);
    }
    return;
  }
#endif
  const int mi = m, ni = n, ki = k, ldai = lda, ldbi = ldb, ldci = ldc;
  sgemm_(transpose_b ? "T" : "N", transpose_a ? "T" : "N", &ni, &mi, &ki, &alpha, b, &ldbi, a, &ldai, &beta, c, &ldci);
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

  // Queries a task holds: a block of the window, else 128 global queries (measured 15% faster than
  // 32 at 4096 long keys: each chunk's GEMMs read all the long keys and values), so that a chunk's
  // scores stay in a core's cache between the GEMMs and the row pass. With talking heads a task
  // holds all heads: at most 2^21 floats (8 MB) of scores (40 rows at 12 heads x 4352 keys; 32
  // rows measured 10% faster than 10 rows in 2 MB).
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

void check_rows(const at::Tensor& tensor, const char* name, const at::Tensor& query) {
  TORCH_CHECK(tensor.device().is_cpu() && tensor.scalar_type() == at::kFloat, name, " must be CPU float32");
  TORCH_CHECK(tensor.dim() == 4 && tensor.size(0) == query.size(0) && tensor.size(1) == query.size(1) &&
              tensor.size(3) == query.size(3), name, " must be [B, h, N, d] like the query");
  TORCH_CHECK(tensor.stride(3) == 1, name, "'s rows must be contiguous");
}

void check_scores(const c10::optional<at::Tensor>& tensor, const char* name, const at::Tensor& query, int64_t width,
                  at::ScalarType dtype = at::kFloat) {
  if (!tensor.has_value()) return;
  check(*tensor, name, dtype, 4);
  TORCH_CHECK(tensor->sizes() == at::IntArrayRef({query.size(0), query.size(1), query.size(2), width}), name,
              " must be [B, h, M, N]");
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
  const float* relative;
  const int32_t* ids;
  const float* carried;
  const float* mask;
  const uint8_t* keep;
  float* summed;
  float* probs;

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
        context(checked(context_out, "context_out", query)), relative(data_or_null(relative_terms)),
        ids(relative_ids.has_value() ? relative_ids->data_ptr<int32_t>() : nullptr), carried(data_or_null(carried_scores)),
        mask(mask_bias.data_ptr<float>()), keep(keep_mask.has_value() ? keep_mask->data_ptr<uint8_t>() : nullptr),
        summed(summed_out.has_value() ? summed_out->data_ptr<float>() : nullptr),
        probs(probs_out.has_value() ? probs_out->data_ptr<float>() : nullptr) {
    const int64_t width = pieces.width;
    TORCH_CHECK(first_values.size(2) == pieces.first_rows && second_values.size(2) == pieces.second_rows,
                "keys and values differ in length");
    TORCH_CHECK(context_out.size(2) == rows, "context_out must have the query's rows");
    check(mask_bias, "mask_bias", at::kFloat, 3);
    TORCH_CHECK(mask_bias.sizes() == at::IntArrayRef({batch, rows, width}), "mask_bias must be [B, M, N]");
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
      TORCH_CHECK(relative_terms->size(2) == rows, "relative must be [B, h, M, R]");
      TORCH_CHECK(relative_ids->sizes() == mask_bias.sizes(), "ids must be [B, M, N]");
    }
  }

  static const at::Tensor& checked(const at::Tensor& tensor, const char* name, const at::Tensor& query) {
    check_rows(tensor, name, query);
    return tensor;
  }
};

// Global queries a task holds when ranges narrow their keys: a chunk's keys are the union of its
// rows' ranges, so chunks of a few consecutive sentences stay narrow (at 4096 tokens and 256
// sentences, 6 layers: 22 ms at 16 rows, 26 at 32, 37 at 64, 65 at 128; 98 ms without ranges).
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
std::pair<int64_t, int64_t> chunk_range(const int32_t* ranges, int64_t count) {
  int64_t low = std::numeric_limits<int64_t>::max(), high = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (ranges[2 * i] >= ranges[2 * i + 1]) continue;  // a row that sees no second key
    low = std::min<int64_t>(low, ranges[2 * i]);
    high = std::max<int64_t>(high, ranges[2 * i + 1]);
  }
  return low < high ? std::pair<int64_t, int64_t>{low, high} : std::pair<int64_t, int64_t>{0, 0};
}

// key_ranges [B, M, 2] int32 (see chunk_range), or null without.
const int32_t* checked_ranges(const c10::optional<at::Tensor>& key_ranges, int64_t batch, int64_t rows,
                              int64_t window_block) {
  if (!key_ranges.has_value()) return nullptr;
  check(*key_ranges, "key_ranges", at::kInt, 3);
  TORCH_CHECK(key_ranges->sizes() == at::IntArrayRef({batch, rows, 2}), "key_ranges must be [B, M, 2]");
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
void apply_keep(const uint8_t* __restrict keep, float keep_scale, int64_t n, float* __restrict values) {
#pragma omp simd
  for (int64_t e = 0; e < n; ++e) values[e] = keep[e] ? values[e] * keep_scale : 0.0f;
}

// Dropped weights for the values: probs * keep * keep_scale.
void drop(const float* __restrict probs, const uint8_t* __restrict keep, float keep_scale, int64_t width,
          float* __restrict dropped) {
#pragma omp simd
  for (int64_t c = 0; c < width; ++c) dropped[c] = keep[c] ? probs[c] * keep_scale : 0.0f;
}

}  // namespace

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

namespace {

// The tensors of one softmax's backward, [B, h, N, d] at their strides, and its shape.
struct Operands {
  Rows<const float> q, k1, v1, k2, v2, grad_out;
  Rows<float> dq, dk1, dv1, dk2, dv2;
  int64_t batch, heads, rows, size;
  Pieces pieces;
};

// The operands of a backward, checked: [B, h, N, d] like the query, rows contiguous; probs, keep,
// grad_summed and grad_scores_out [B, h, M, N].
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

void attention_backward(const at::Tensor& query, double query_scale, const at::Tensor& first_keys,
                        const at::Tensor& first_values, int64_t window_block, const at::Tensor& second_keys,
                        const at::Tensor& second_values, const at::Tensor& probs, const c10::optional<at::Tensor>& keep,
                        double keep_scale, const at::Tensor& grad_context, const c10::optional<at::Tensor>& grad_summed,
                        double scale, const at::Tensor& grad_scores_out, const at::Tensor& grad_query,
                        const at::Tensor& grad_first_keys, const at::Tensor& grad_first_values,
                        const at::Tensor& grad_second_keys, const at::Tensor& grad_second_values,
                        const c10::optional<at::Tensor>& key_ranges) {
  // The gradients of attention_forward's: from grad_context [B, h, M, d] and grad_summed [B, h, M, N]
  // (that of the summed scores carried on), grad_scores_out [B, h, M, N] (of the scores, the picked
  // relative terms and the carried scores alike) is written and the gradients of query, keys and
  // values (views at their strides, as their inputs) are added to. Tasks are (batch, head), the
  // chunks of one head in turn: overlapping windows add to the same key rows.
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

namespace {

// Talking heads without a window (the global queries) in three passes, so that the q.k and weights
// @ values GEMMs run per head over 128 queries as without talking heads, rather than over the few
// queries whose scores of all heads fit in cache (they read all the long keys and values each
// time: 2.6x the plain softmax's time at 4096 tokens, against 1.7x for the long softmax). The
// summed scores and the weights make a round trip through memory instead (53 MB each there).
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
  for (const auto* mix : {&pre, &post}) {
    check(*mix, "pre/post", at::kFloat, 2);
    TORCH_CHECK(mix->size(0) == f.heads && mix->size(1) == f.heads, "the head mixes must be [h, h]");
  }
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
  for (const auto* mix : {&pre, &post, &grad_pre, &grad_post}) {
    check(*mix, "pre/post/grad_pre/grad_post", at::kFloat, 2);
    TORCH_CHECK(mix->size(0) == o.heads && mix->size(1) == o.heads, "the head mixes must be [h, h]");
  }

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


// Returns whether the own products are in use: only where this build has AVX-512.
bool use_own_products(bool on) {
#if defined(__AVX512F__)
  own_products = on;
#endif
  return own_products;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("use_own_products", &use_own_products, "q k^T and weights @ values on this file's AVX-512 code, not BLAS");
  module.def("uses_own_products", [] { return own_products; }, "Whether use_own_products(true) is in effect");
  module.def("attention_forward", &attention_forward, "One softmax of global-local attention, scores to context");
  module.def("attention_backward", &attention_backward, "The gradients of attention_forward's inputs");
  module.def("talking_heads_forward", &talking_heads_forward, "attention_forward with talking heads");
  module.def("talking_heads_backward", &talking_heads_backward, "Talking heads' backward");
}
