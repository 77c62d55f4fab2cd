// The small products of the attention kernels (products.cpp): BLAS's sgemm, which torch's CPU build
// carries (MKL or OpenBLAS), called single-threaded inside the kernels' parallel loops; or, after
// `use_own_products(true)` (on CPUs where MKL keeps to its AVX2 code: longdoc.model.linear decides),
// products.cpp's own AVX-512 or AVX2 code for the two kinds attention has: q k^T over a head's d
// columns, and op(A) @ B (weights @ values, the backward's products with a transposed A, talking
// heads' mixes).

#pragma once

#include <cstdint>

namespace longdoc::attention {

// Row-major C[m, n] = alpha * op(A) @ op(B) + beta * C, op(A) [m, k] and op(B) [k, n], each matrix at
// its own row stride; `transpose_a`: A is stored [k, m] (op(A) = A^T), likewise B.
void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// Whether gemm() takes the own products where it can (set once per process); returns whether they
// are in use, which only a build with AVX-512 or AVX2 allows.
bool use_own_products(bool on);
bool uses_own_products();

}  // namespace longdoc::attention
