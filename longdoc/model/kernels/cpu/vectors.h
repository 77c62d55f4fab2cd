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

// What both instruction sets do alike, in GCC's and Clang's vector arithmetic (in which their
// intrinsics' headers are written: a * b is vmulps at either width). `Isa` is the deriving struct;
// its Vector is read where a function is used (the struct is complete by then).
template <typename Isa>
struct Vectors {
  static auto zero() { return typename Isa::Vector{}; }
  // x in every lane: the scalar is broadcast to the vector's width, and x - 0 is x exactly (-0 and
  // NaN included), so that the compiler emits one vbroadcastss (a loop setting the lanes became
  // vinsertps chains in the product tiles, 1.5x slower).
  static auto broadcast(float x) { return x - typename Isa::Vector{}; }
  static auto load(const float* p) {
    typename Isa::Vector v;
    __builtin_memcpy(&v, p, sizeof v);  // (an unaligned load)
    return v;
  }
  template <typename V>
  static void store(float* p, V v) { __builtin_memcpy(p, &v, sizeof v); }
  template <typename V>
  static V mul(V a, V b) { return a * b; }
  template <typename V>
  static V add(V a, V b) { return a + b; }
};

// Each instruction set's own: masks, the fused multiply-add, the product tiles' shapes, and the
// steps of transposing kLanes rows in registers (products.cpp's transpose): within each 128-bit
// lane (unpack_low, unpack_high, shuffle, as SSE's), then across the lanes (cross_lanes).
#if defined(__AVX512F__)
struct Avx512 : Vectors<Avx512> {
  using Vector = __m512;
  static constexpr int64_t kLanes = 16;
  using Lanes = __mmask16;  // the lanes a masked load or store touches
  // The rows of a product tile of V vectors (index V): 24 sums in the 32 registers.
  static constexpr std::array<int, 5> kTileRows{0, 24, 12, 8, 6};
  static constexpr int64_t kBlockVectors = 4;  // the widest tile's vectors
  static constexpr bool kCopyB = false;  // (products.cpp's kCopyBFromRows: not measured at AVX-512)

  // The first `count` lanes (all for kLanes or more, none for 0 or fewer).
  static Lanes first_lanes(int64_t count) {
    return count >= kLanes ? static_cast<Lanes>(0xFFFF) : static_cast<Lanes>((1u << (count > 0 ? count : 0)) - 1);
  }
  static Vector masked_load(const float* p, Lanes lanes) { return _mm512_maskz_loadu_ps(lanes, p); }  // others 0
  static void masked_store(float* p, Vector v, Lanes lanes) { _mm512_mask_storeu_ps(p, lanes, v); }
  static Vector fmadd(Vector a, Vector b, Vector c) { return _mm512_fmadd_ps(a, b, c); }

  // u[4i + q], 128-bit lane l: column 4l + q of rows 4i .. 4i + 3 -> r[c]: column c.
  static void cross_lanes(const Vector u[16], Vector r[16]) {
    for (int q = 0; q < 4; ++q) {
      const Vector v0 = _mm512_shuffle_f32x4(u[q], u[4 + q], 0x88), v1 = _mm512_shuffle_f32x4(u[q], u[4 + q], 0xdd);
      const Vector v2 = _mm512_shuffle_f32x4(u[8 + q], u[12 + q], 0x88);
      const Vector v3 = _mm512_shuffle_f32x4(u[8 + q], u[12 + q], 0xdd);
      r[q] = _mm512_shuffle_f32x4(v0, v2, 0x88);
      r[q + 4] = _mm512_shuffle_f32x4(v1, v3, 0x88);
      r[q + 8] = _mm512_shuffle_f32x4(v0, v2, 0xdd);
      r[q + 12] = _mm512_shuffle_f32x4(v1, v3, 0xdd);
    }
  }
  static Vector unpack_low(Vector a, Vector b) { return _mm512_unpacklo_ps(a, b); }
  static Vector unpack_high(Vector a, Vector b) { return _mm512_unpackhi_ps(a, b); }
  template <int kOrder> static Vector shuffle(Vector a, Vector b) { return _mm512_shuffle_ps(a, b, kOrder); }
};
#endif

struct Avx2 : Vectors<Avx2> {
  using Vector = __m256;
  static constexpr int64_t kLanes = 8;
  using Lanes = __m256i;  // the lanes a masked load or store touches: those whose sign bit is set
  // The rows of a product tile of V vectors (index V): at most 12 sums, a row of B and the broadcast
  // in the 16 registers.
  static constexpr std::array<int, 5> kTileRows{0, 12, 6, 4, 2};
  static constexpr int64_t kBlockVectors = 2;  // the widest tile's vectors: 6 rows of 2 (BLIS's 6 x 16)
  static constexpr bool kCopyB = true;  // (products.cpp's kCopyBFromRows)

  // The first `count` lanes (all for kLanes or more, none for 0 or fewer).
  static Lanes first_lanes(int64_t count) {
    const int32_t clipped = static_cast<int32_t>(count < 0 ? 0 : count > kLanes ? kLanes : count);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(clipped), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static Vector masked_load(const float* p, Lanes lanes) { return _mm256_maskload_ps(p, lanes); }  // others 0
  static void masked_store(float* p, Vector v, Lanes lanes) { _mm256_maskstore_ps(p, lanes, v); }
  static Vector fmadd(Vector a, Vector b, Vector c) { return _mm256_fmadd_ps(a, b, c); }

  // u[4i + q], 128-bit lane l: column 4l + q of rows 4i .. 4i + 3 -> r[c]: column c.
  static void cross_lanes(const Vector u[8], Vector r[8]) {
    for (int q = 0; q < 4; ++q) {
      r[q] = _mm256_permute2f128_ps(u[q], u[4 + q], 0x20);
      r[q + 4] = _mm256_permute2f128_ps(u[q], u[4 + q], 0x31);
    }
  }
  static Vector unpack_low(Vector a, Vector b) { return _mm256_unpacklo_ps(a, b); }
  static Vector unpack_high(Vector a, Vector b) { return _mm256_unpackhi_ps(a, b); }
  template <int kOrder> static Vector shuffle(Vector a, Vector b) { return _mm256_shuffle_ps(a, b, kOrder); }
};

#if defined(__AVX512F__)
using VectorIsa = Avx512;
#else
using VectorIsa = Avx2;
#endif

}  // namespace longdoc::attention

#endif
