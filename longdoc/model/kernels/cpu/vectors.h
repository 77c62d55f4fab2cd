// The vector operations the kernels' own code is written in (products.cpp, forward.cpp), for the
// widest instruction set the build has: AVX-512 (16 floats a vector, 32 registers) or AVX2 with FMA
// (8 floats, 16 registers). VectorIsa names it, and LONGDOC_VECTORS is defined where the build has
// either; a build with neither has only the portable loops, which the compiler vectorises as it can.

#pragma once

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#define LONGDOC_VECTORS

#include <immintrin.h>

#include <array>
#include <cstdint>

namespace longdoc::attention {

#if defined(__AVX512F__)
struct Avx512 {
  using Vector = __m512;
  using Lanes = __mmask16;  // the lanes a masked load or store touches
  static constexpr int64_t kLanes = 16;
  // The rows of a product tile of V vectors (index V): 24 sums in the 32 registers.
  static constexpr std::array<int, 5> kTileRows{0, 24, 12, 8, 6};
  static constexpr int64_t kBlockVectors = 4;  // the widest tile's vectors

  // The first `count` lanes (all for kLanes or more, none for 0 or fewer).
  static Lanes first_lanes(int64_t count) {
    return count >= kLanes ? static_cast<Lanes>(0xFFFF) : static_cast<Lanes>((1u << (count > 0 ? count : 0)) - 1);
  }
  static Vector zero() { return _mm512_setzero_ps(); }
  static Vector broadcast(float x) { return _mm512_set1_ps(x); }
  static Vector load(const float* p) { return _mm512_loadu_ps(p); }
  static Vector load(const float* p, Lanes lanes) { return _mm512_maskz_loadu_ps(lanes, p); }  // others 0
  static void store(float* p, Vector v) { _mm512_storeu_ps(p, v); }
  static void store(float* p, Vector v, Lanes lanes) { _mm512_mask_storeu_ps(p, lanes, v); }
  static Vector fmadd(Vector a, Vector b, Vector c) { return _mm512_fmadd_ps(a, b, c); }
  static Vector mul(Vector a, Vector b) { return _mm512_mul_ps(a, b); }
  static Vector add(Vector a, Vector b) { return _mm512_add_ps(a, b); }
};
#endif

struct Avx2 {
  using Vector = __m256;
  using Lanes = __m256i;  // the lanes a masked load or store touches: those whose sign bit is set
  static constexpr int64_t kLanes = 8;
  // The rows of a product tile of V vectors (index V): at most 12 sums, a row of B and the broadcast
  // in the 16 registers.
  static constexpr std::array<int, 5> kTileRows{0, 12, 6, 4, 2};
  static constexpr int64_t kBlockVectors = 2;  // the widest tile's vectors: 6 rows of 2 (BLIS's 6 x 16)

  // The first `count` lanes (all for kLanes or more, none for 0 or fewer).
  static Lanes first_lanes(int64_t count) {
    const int32_t clipped = static_cast<int32_t>(count < 0 ? 0 : count > kLanes ? kLanes : count);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(clipped), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static Vector zero() { return _mm256_setzero_ps(); }
  static Vector broadcast(float x) { return _mm256_set1_ps(x); }
  static Vector load(const float* p) { return _mm256_loadu_ps(p); }
  static Vector load(const float* p, Lanes lanes) { return _mm256_maskload_ps(p, lanes); }  // others 0
  static void store(float* p, Vector v) { _mm256_storeu_ps(p, v); }
  static void store(float* p, Vector v, Lanes lanes) { _mm256_maskstore_ps(p, lanes, v); }
  static Vector fmadd(Vector a, Vector b, Vector c) { return _mm256_fmadd_ps(a, b, c); }
  static Vector mul(Vector a, Vector b) { return _mm256_mul_ps(a, b); }
  static Vector add(Vector a, Vector b) { return _mm256_add_ps(a, b); }
};

#if defined(__AVX512F__)
using VectorIsa = Avx512;
#else
using VectorIsa = Avx2;
#endif

}  // namespace longdoc::attention

#endif
