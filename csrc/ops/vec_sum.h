// keel/csrc/ops/vec_sum.h
// Horizontal sums of fp32 vectors in ONE fixed tree, shared by the GEMV kernels (linear_cpu.cpp,
// fp8_linear_cpu.cpp): every output of a kernel ends with the same lane sum whichever helper computes it,
// so a row's bits do not depend on how many outputs are reduced together (issue 27).
//   hsum8(v)   = ((v0 + v4) + (v1 + v5)) + ((v2 + v6) + (v3 + v7))
//   hsum16(v)  = hsum8 of (v[0:8] + v[8:16])
//   hsum16x4(a, b, c, d): lane j = hsum16 of the j-th vector, four at once (about a third of the
//     instructions of four hsum16: one fold per vector, then three hadds)
#pragma once

#include "stable/kernel_types.h"

#if defined(__AVX2__)
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
#endif  // __AVX2__

}  // namespace keel::KEEL_CPU_NS::vec
