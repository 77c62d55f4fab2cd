// The attention kernels' small products (see products.h): BLAS's sgemm, or this file's own AVX-512
// code for the products attention has.

#include "products.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <vector>

// BLAS's single-precision GEMM (column-major, Fortran calling convention), exported by torch's CPU build.
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);

namespace longdoc::attention {
namespace {

// Whether gemm() runs attention's two shapes on the code below instead of BLAS (set once per process).
bool own_products = false;

#if defined(__AVX512F__)
// The products attention has, for a CPU whose BLAS keeps to AVX2 (there faster than its sgemm on the
// long softmax's q k^T, 84 x 252 with d = 32, and its weights @ values). Each keeps a tile of C in 24
// registers and streams the other operand past it: q k^T over the keys packed transposed, op(A) @ B
// (weights @ values, the backward's products with a transposed A, talking heads' mixes) over B's
// rows as they lie.

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
// (`TransposeA`). (Whole vectors take no masks: masked loads and stores are slower.)
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

}  // namespace

// BLAS is column-major, where row-major C is C^T = op(B)^T op(A)^T.
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

bool use_own_products(bool on) {
#if defined(__AVX512F__)
  own_products = on;
#endif
  return own_products;
}

bool uses_own_products() { return own_products; }

}  // namespace longdoc::attention
