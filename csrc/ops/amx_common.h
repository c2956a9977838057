// keel/csrc/ops/amx_common.h
// Helpers of the AMX prompt kernels (linear_amx_cpu.cpp, fp8_linear_amx_cpu.cpp): the tile configuration, a 16 x 16
// transpose of 32-bit elements, the x packing into the B-tile layout, and the bf16 store. Only the AVX2
// build includes the AMX code; the functions run only when keel::cpu_has_amx() said yes.
#pragma once

#include <cstdint>
#include <cstring>

#include "ops/vec_sum.h"
#include "stable/kernel_types.h"

#if defined(__AVX2__)
// (vec_sum.h, included above, silences GCC 12's intrinsic-header warnings)
#include <immintrin.h>

#define KEEL_AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")))

namespace keel::KEEL_CPU_NS::amx {

// Palette 1, all 8 tiles 16 rows x 64 bytes: tmm0..3 accumulators (C), tmm4/5 A, tmm6/7 B.
struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Loads the configuration in the calling thread (tile state is per thread); release() ends it.
KEEL_AMX inline void configure() {
  TileConfig c;
  std::memset(&c, 0, sizeof(c));
  c.palette = 1;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  _tile_loadconfig(&c);
}

KEEL_AMX inline void release() { _tile_release(); }

// out[c] = column c of the 16 x 16 matrix of 32-bit elements in r[0..15] (rows).
KEEL_AMX KEEL_KINLINE void transpose16(const __m512i* r, __m512i* out) {
  __m512i t[16], u[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4 q + j], lane L: column 4 L + j of rows 4 q .. 4 q + 3
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    u[4 * q + 0] = _mm512_unpacklo_epi64(t[4 * q], t[4 * q + 2]);
    u[4 * q + 1] = _mm512_unpackhi_epi64(t[4 * q], t[4 * q + 2]);
    u[4 * q + 2] = _mm512_unpacklo_epi64(t[4 * q + 1], t[4 * q + 3]);
    u[4 * q + 3] = _mm512_unpackhi_epi64(t[4 * q + 1], t[4 * q + 3]);
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m512i x0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x44);
    const __m512i x1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xEE);
    const __m512i y0 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x44);
    const __m512i y1 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xEE);
    out[j] = _mm512_shuffle_i32x4(x0, y0, 0x88);
    out[4 + j] = _mm512_shuffle_i32x4(x0, y0, 0xDD);
    out[8 + j] = _mm512_shuffle_i32x4(x1, y1, 0x88);
    out[12 + j] = _mm512_shuffle_i32x4(x1, y1, 0xDD);
  }
}

// Packs 16-row groups [g0, g1) of bf16 x ([m, k], row i at x + i * x_row) into the B-tile layout
// dst[((g * kp / 2) + j) * 32 + 2 r + t] = x[16 g + r][2 j + t], zeros past m and k (kp a multiple of 32).
KEEL_AMX inline void pack_x(const uint16_t* x, int64_t x_row, int64_t m, int64_t k, int64_t kp, uint16_t* dst,
                            int64_t g0, int64_t g1) {
  for (int64_t g = g0; g < g1; ++g) {
    uint16_t* gd = dst + g * (kp / 2) * 32;
    for (int64_t k0 = 0; k0 < kp; k0 += 32) {
      const int64_t left = k - k0;
      const __mmask32 mask = left >= 32 ? ~__mmask32{0} : left <= 0 ? __mmask32{0} : (__mmask32{1} << left) - 1;
      __m512i r[16], c[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        const int64_t row = 16 * g + i;
        r[i] = row < m ? _mm512_maskz_loadu_epi16(mask, x + row * x_row + k0) : _mm512_setzero_si512();
      }
      transpose16(r, c);
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j) _mm512_storeu_si512(gd + (k0 / 2 + j) * 32, c[j]);
    }
  }
}

using vec::round_bf16;  // fp32 -> bf16 as keel::store(bf16_t*, float), 16 lanes (vec_sum.h)

// 32 outputs of one x row (lo: features 0..15, hi: 16..31) -> bf16 at dst, the first `count` of them. Rounded
// as keel::store(bf16_t*, float): vcvtne2ps2bf16 (nearest even, quiet NaN) matches it except on fp32
// subnormal inputs, which it reads as zero: a vector holding one takes round_bf16 instead.
KEEL_AMX KEEL_KINLINE void store_bf16x32(uint16_t* dst, __m512 lo, __m512 hi, __mmask32 count_mask) {
  const __m512 tiny = _mm512_set1_ps(1.17549435e-38f);  // smallest normal fp32
  const __mmask16 sub_lo = _mm512_cmp_ps_mask(_mm512_abs_ps(lo), tiny, _CMP_LT_OQ) &
                           _mm512_cmp_ps_mask(lo, _mm512_setzero_ps(), _CMP_NEQ_UQ);
  const __mmask16 sub_hi = _mm512_cmp_ps_mask(_mm512_abs_ps(hi), tiny, _CMP_LT_OQ) &
                           _mm512_cmp_ps_mask(hi, _mm512_setzero_ps(), _CMP_NEQ_UQ);
  __m512i r;
  if ((sub_lo | sub_hi) == 0) {
    r = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
  } else {
    r = _mm512_inserti64x4(_mm512_castsi256_si512(round_bf16(lo)), round_bf16(hi), 1);
  }
  _mm512_mask_storeu_epi16(dst, count_mask, r);
}

// The 4 accumulator tiles of one block of 32 weight rows x 32 x rows, as fp32 acc[n-half * 2 + m-half][16 n][16 m]
// (out^T): adds the bias (bias32: the block's 32 values, used when has_bias) and stores the valid part to out
// ([m, n] bf16), 32 features (one 64-byte row piece) per x row.
KEEL_AMX inline void store_block(uint16_t* out, int64_t m, int64_t n, const float (*acc)[16][16], const float* bias32,
                                 bool has_bias, int64_t n0, int64_t m0) {
  const int64_t nv = n - n0 < 32 ? n - n0 : 32;
  const __mmask32 nmask = nv >= 32 ? ~__mmask32{0} : (__mmask32{1} << nv) - 1;
  const __m512 bv0 = _mm512_loadu_ps(bias32), bv1 = _mm512_loadu_ps(bias32 + 16);
  for (int b = 0; b < 2; ++b) {  // x-row half
    const int64_t mm = m0 + 16 * b;
    if (mm >= m) break;
    __m512i r[16], c0[16], c1[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) r[i] = _mm512_load_si512(acc[b][i]);
    transpose16(r, c0);  // c0[j]: x row mm + j, weight rows n0 .. n0 + 15
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) r[i] = _mm512_load_si512(acc[2 + b][i]);
    transpose16(r, c1);  // weight rows n0 + 16 .. n0 + 31
    const int64_t mv = m - mm < 16 ? m - mm : 16;
    for (int64_t j = 0; j < mv; ++j) {
      __m512 lo = _mm512_castsi512_ps(c0[j]), hi = _mm512_castsi512_ps(c1[j]);
      if (has_bias) {
        lo = _mm512_add_ps(lo, bv0);
        hi = _mm512_add_ps(hi, bv1);
      }
      store_bf16x32(out + (mm + j) * n + n0, lo, hi, nmask);
    }
  }
}

}  // namespace keel::KEEL_CPU_NS::amx
#endif  // __AVX2__
