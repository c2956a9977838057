// keel/csrc/ops/vec_sum.h
// Horizontal sums of fp32 vectors in ONE fixed tree, shared by the GEMV kernels (linear_cpu.cpp,
// fp8_linear_cpu.cpp): every output of a kernel ends with the same lane sum whichever helper computes it,
// so a row's bits do not depend on how many outputs are reduced together.
//   hsum8(v)   = ((v0 + v4) + (v1 + v5)) + ((v2 + v6) + (v3 + v7))
//   hsum16(v)  = hsum8 of (v[0:8] + v[8:16])
//   hsum16x4(a, b, c, d): lane j = hsum16 of the j-th vector, four at once (about a third of the
//     instructions of four hsum16: one fold per vector, then three hadds)
//   hsum16x16(v): lane 4k + t = hsum16 of v[4t + k], sixteen at once (45 shuffles and adds, about half of
//     four hsum16x4, and the sums land in one vector for one rounding and four stores)
// and round_bf16: fp32 -> bf16 bit for bit as keel::store(bf16_t*, float), 16 lanes at once.
#pragma once

#include "stable/kernel_types.h"

#if defined(__AVX2__)
// GCC 12's intrinsic headers self-initialize their undefined-value placeholders (`__Y = __Y`), which its
// uninitialized-use warnings flag where the shuffles below are inlined
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#endif

namespace keel::KEEL_CPU_NS::vec {

typedef float f32x8 __attribute__((vector_size(32)));

KEEL_KINLINE float hsum8(const f32x8& v) { return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7])); }

#if defined(__AVX2__)
#define KEEL_VEC_AVX512 __attribute__((target("avx512f")))

typedef float f32x16 __attribute__((vector_size(64)));

// (GCC 12's _mm512_reduce_add_ps trips -Wmaybe-uninitialized, and its tree is not hsum8's.)
KEEL_VEC_AVX512 KEEL_KINLINE float hsum16(__m512 v) {
  const f32x16 u = (f32x16)v;
  return hsum8(__builtin_shufflevector(u, u, 0, 1, 2, 3, 4, 5, 6, 7) +
               __builtin_shufflevector(u, u, 8, 9, 10, 11, 12, 13, 14, 15));
}

// (v0+v8 .. v7+v15), then its two 4-lane halves added: b[i] = (v[i] + v[i+8]) + (v[i+4] + v[i+12])
KEEL_VEC_AVX512 KEEL_KINLINE __m128 fold16(__m512 v) {
  const f32x16 u = (f32x16)v;
  const f32x8 h = __builtin_shufflevector(u, u, 0, 1, 2, 3, 4, 5, 6, 7) +
                  __builtin_shufflevector(u, u, 8, 9, 10, 11, 12, 13, 14, 15);
  return (__m128)(__builtin_shufflevector(h, h, 0, 1, 2, 3) + __builtin_shufflevector(h, h, 4, 5, 6, 7));
}

// lane j = hsum16 of the j-th vector: (b0 + b1) + (b2 + b3) of each fold16, which is hsum8's tree
KEEL_VEC_AVX512 KEEL_KINLINE __m128 hsum16x4(__m512 a, __m512 b, __m512 c, __m512 d) {
  return _mm_hadd_ps(_mm_hadd_ps(fold16(a), fold16(b)), _mm_hadd_ps(fold16(c), fold16(d)));
}

// hsum16's tree level by level across vectors, two vectors' halves into one vector at each level:
//   i + 8 (256-bit halves), i + 4 (128-bit quarters), then (0 + 1), (2 + 3), then their sum.
KEEL_VEC_AVX512 KEEL_KINLINE __m512 hsum16x16(const __m512* v) {
  __m512 h[8], b[4], c[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)  // h[i] = [v[2i][0:8] + v[2i][8:16] | the same of v[2i + 1]]
    h[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)  // quarter q of b[i]: the 4-lane fold16 of v[4i + q]
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], 0xDD));
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i)  // quarter q of c[i]: (f0 + f1, f2 + f3) of v[8i + q], then of v[8i + 4 + q]
    c[i] =
        _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0x88), _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0xDD));
  // quarter k: the sums of v[k], v[4 + k], v[8 + k], v[12 + k]
  return _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x88), _mm512_shuffle_ps(c[0], c[1], 0xDD));
}

// fp32 -> bf16 as keel::store(bf16_t*, float) does: round to nearest even, a NaN stays a quiet NaN (subnormals
// too, which vcvtneps2bf16 would read as zero).
KEEL_VEC_AVX512 KEEL_KINLINE __m256i round_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}
#endif  // __AVX2__

}  // namespace keel::KEEL_CPU_NS::vec
