// The attention kernels' small products (see products.h): BLAS's sgemm, or this file's own AVX-512
// or AVX2 code for the products attention has.

#include "products.h"
#include "vectors.h"

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

#if defined(LONGDOC_VECTORS)
// The products attention has, for a CPU whose BLAS keeps to AVX2 (there faster than its sgemm on the
// long softmax's q k^T, 84 x 252 with d = 32, and its weights @ values: calls too small for BLAS's
// packing to pay). Each keeps a tile of C in registers (24 of AVX-512's 32; 12 of AVX2's 16, 6 rows
// of 16 columns at most) and streams the other operand past it: q k^T over the keys packed
// transposed, op(A) @ B (weights @ values, the backward's products with a transposed A, talking
// heads' mixes) over B's rows as they lie. One template for both instruction sets: `Isa` (Avx512 or
// Avx2, vectors.h) gives the vector operations and the tiles' shapes. In the AVX2 build they took
// the long softmax's forward from 177 to 157 ms and its backward from 268 to 225 ms against MKL's
// sgemm (AMD EPYC Zen 5 at ATEN_CPU_CAPABILITY=avx2, one thread, 4096 tokens; tiles 4 vectors wide
// were slower than MKL).

// Isa::kLanes rows of as many floats -> their columns, in registers: pairs of rows interleaved, then
// quadruples of rows gathered within each 128-bit lane, then the lanes exchanged (Isa::cross_lanes).
template <typename Isa>
inline void transpose(typename Isa::Vector r[Isa::kLanes]) {
  constexpr int kLanes = static_cast<int>(Isa::kLanes);
  typename Isa::Vector t[kLanes], u[kLanes];
  for (int i = 0; i < kLanes / 2; ++i) {
    t[2 * i] = Isa::unpack_low(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = Isa::unpack_high(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < kLanes / 4; ++i) {  // u[4i + q], 128-bit lane l: column 4l + q of rows 4i .. 4i + 3
    u[4 * i] = Isa::template shuffle<_MM_SHUFFLE(1, 0, 1, 0)>(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = Isa::template shuffle<_MM_SHUFFLE(3, 2, 3, 2)>(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = Isa::template shuffle<_MM_SHUFFLE(1, 0, 1, 0)>(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = Isa::template shuffle<_MM_SHUFFLE(3, 2, 3, 2)>(t[4 * i + 1], t[4 * i + 3]);
  }
  Isa::cross_lanes(u, r);
}

// B [n, k] (row stride ldb) -> packed [k, np]: column j of the packed rows is row j of B.
template <typename Isa>
void pack_transposed(const float* b, int64_t ldb, int64_t n, int64_t k, float* packed, int64_t np) {
  constexpr int64_t kLanes = Isa::kLanes;
  typename Isa::Vector r[kLanes];
  for (int64_t j = 0; j < n; j += kLanes) {
    const int64_t rows = std::min<int64_t>(kLanes, n - j);
    for (int64_t depth = 0; depth < k; depth += kLanes) {
      const auto lanes = Isa::first_lanes(k - depth);
      for (int64_t i = 0; i < kLanes; ++i) {
        r[i] = i < rows ? Isa::masked_load(b + (j + i) * ldb + depth, lanes) : Isa::zero();
      }
      transpose<Isa>(r);
      for (int64_t q = 0; q < std::min<int64_t>(kLanes, k - depth); ++q) Isa::store(packed + (depth + q) * np + j, r[q]);
    }
  }
}

// R rows of C [.., Isa::kLanes V columns; with `Masked`, only the last vector's `last` lanes of its
// last kLanes] = alpha * op(A) [R, k] @ B [k, ..] (+ C where `accumulate`); op(A) = A, or A^T with A
// stored [k, R] (`TransposeA`). (Whole vectors take no masks: masked loads and stores are slower.)
template <typename Isa, int V, int R, bool TransposeA, bool Masked>
inline void product_tile(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k, float alpha,
                         bool accumulate, float* c, int64_t ldc, typename Isa::Lanes last) {
  using Vector = typename Isa::Vector;
  constexpr int64_t kLanes = Isa::kLanes;
  Vector sum[R][V];
  for (int r = 0; r < R; ++r)
    for (int q = 0; q < V; ++q) sum[r][q] = Isa::zero();
  for (int64_t depth = 0; depth < k; ++depth) {
    Vector row[V];
    for (int q = 0; q < V; ++q) {
      row[q] = Masked && q == V - 1 ? Isa::masked_load(b + depth * ldb + kLanes * q, last) : Isa::load(b + depth * ldb + kLanes * q);
    }
    for (int r = 0; r < R; ++r) {
      const Vector x = Isa::broadcast(TransposeA ? a[depth * lda + r] : a[r * lda + depth]);
      for (int q = 0; q < V; ++q) sum[r][q] = Isa::fmadd(x, row[q], sum[r][q]);
    }
  }
  const Vector scale = Isa::broadcast(alpha);
  for (int r = 0; r < R; ++r) {
    for (int q = 0; q < V; ++q) {
      float* out = c + r * ldc + kLanes * q;
      const Vector value = Isa::mul(sum[r][q], scale);
      if (Masked && q == V - 1) {
        Isa::masked_store(out, accumulate ? Isa::add(Isa::masked_load(out, last), value) : value, last);
      } else {
        Isa::store(out, accumulate ? Isa::add(Isa::load(out), value) : value);
      }
    }
  }
}

// Rows in tiles of R, the rest in tiles of R / 2, R / 4, ...
template <typename Isa, int V, int R, bool TransposeA, bool Masked>
void product_rows(int64_t m, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k, float alpha,
                  bool accumulate, float* c, int64_t ldc, typename Isa::Lanes last) {
  const int64_t row_step = TransposeA ? 1 : lda;  // from one row of op(A) to the next
  int64_t i = 0;
  for (; i + R <= m; i += R) {
    product_tile<Isa, V, R, TransposeA, Masked>(a + i * row_step, lda, b, ldb, k, alpha, accumulate, c + i * ldc,
                                                ldc, last);
  }
  if constexpr (R > 1) {
    if (i < m) product_rows<Isa, V, R / 2, TransposeA, Masked>(m - i, a + i * row_step, lda, b, ldb, k, alpha,
                                                              accumulate, c + i * ldc, ldc, last);
  }
}

// One block of up to 4 vectors of columns: V vectors, Isa::kTileRows[V] rows at a time (a tile's
// sums, a row of B and the broadcast fit in the registers).
template <typename Isa, bool TransposeA, bool Masked>
void product_block(int64_t vectors, int64_t m, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k,
                   float alpha, bool accumulate, float* c, int64_t ldc, typename Isa::Lanes last) {
  constexpr auto kRows = Isa::kTileRows;
  switch (vectors) {
    case 1: product_rows<Isa, 1, kRows[1], TransposeA, Masked>(m, a, lda, b, ldb, k, alpha, accumulate, c, ldc, last); break;
    case 2: product_rows<Isa, 2, kRows[2], TransposeA, Masked>(m, a, lda, b, ldb, k, alpha, accumulate, c, ldc, last); break;
    case 3: product_rows<Isa, 3, kRows[3], TransposeA, Masked>(m, a, lda, b, ldb, k, alpha, accumulate, c, ldc, last); break;
    default: product_rows<Isa, 4, kRows[4], TransposeA, Masked>(m, a, lda, b, ldb, k, alpha, accumulate, c, ldc, last); break;
  }
}

// Rows of C from which own_gemm_nn copies B's blocks of columns into contiguous rows (Isa::kCopyB):
// B's rows as the backward reads them, a head's q or the context's gradient, lie a token's heads
// apart (1536 bytes at 12 heads of 32), so they share a few of L1's sets (8 of Zen 3's 64) and every
// tile of C's rows re-reads them from L2. Measured at AVX2 on the AMD EPYC Zen 3, one thread, 4096
// tokens: the long softmax's backward (keys' and values' gradients, 255 rows) 4-6% faster with the
// copy; its forward (weights @ values, 85 rows) 2-3% slower, so it stays below this.
constexpr int64_t kCopyBFromRows = 128;

// C [m, n] = alpha * op(A) [m, k] @ B [k, n] (+ C where `accumulate`).
template <bool TransposeA>
void own_gemm_nn(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                 int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  using Isa = VectorIsa;
  constexpr int64_t kLanes = Isa::kLanes, kBlock = Isa::kBlockVectors * kLanes;
  thread_local std::vector<float> b_block;
  const bool copy_b = Isa::kCopyB && ldb > kBlock && m > kCopyBFromRows;
  for (int64_t j = 0; j < n; j += kBlock) {
    const int64_t columns = std::min<int64_t>(kBlock, n - j), vectors = (columns + kLanes - 1) / kLanes;
    const float* block = b + j;
    int64_t block_stride = ldb;
    if (copy_b) {  // (the lanes past `columns` are left as they are: the masked loads do not read them)
      b_block.resize(k * kBlock);
      for (int64_t depth = 0; depth < k; ++depth) {
        std::copy(block + depth * ldb, block + depth * ldb + columns, b_block.data() + depth * kBlock);
      }
      block = b_block.data(), block_stride = kBlock;
    }
    if (columns % kLanes == 0) {
      product_block<Isa, TransposeA, false>(vectors, m, a, lda, block, block_stride, k, alpha, accumulate, c + j,
                                            ldc, Isa::first_lanes(kLanes));
    } else {
      product_block<Isa, TransposeA, true>(vectors, m, a, lda, block, block_stride, k, alpha, accumulate, c + j,
                                           ldc, Isa::first_lanes(columns % kLanes));
    }
  }
}

// C [m, n] = alpha * A [m, k] @ B [n, k]^T (q k^T): B packed transposed, then the product above.
void own_gemm_nt(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                 int64_t ldb, float* c, int64_t ldc) {
  constexpr int64_t kLanes = VectorIsa::kLanes;
  thread_local std::vector<float> packed;
  const int64_t np = (n + kLanes - 1) / kLanes * kLanes;
  packed.resize(k * np);
  pack_transposed<VectorIsa>(b, ldb, n, k, packed.data(), np);
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
#if defined(LONGDOC_VECTORS)
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
#if defined(LONGDOC_VECTORS)
  own_products = on;
#endif
  return own_products;
}

bool uses_own_products() { return own_products; }

}  // namespace longdoc::attention
