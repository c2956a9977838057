// vendored_deps/flash_attn/src/cpu/vec.h
// The CPU kernels' primitives: dtype conversions, fp32 row operations, the AVX-512 score and P.V
// tiles, a vectorizable exp. Included only by flash_fwd_cpu.cpp, inside its per-ISA namespace
// (flash::VENDORED_CPU_ISA_NS), so every ISA build has its own copy.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(VENDORED_CPU_ISA_AVX2) || defined(VENDORED_CPU_ISA_AVX512)
#include <immintrin.h>
#endif

#ifndef VENDORED_CPU_ISA_NS
#error "vec.h belongs to one ISA build of the CPU kernels (VENDORED_CPU_ISA_NS)"
#endif

namespace flash {
namespace VENDORED_CPU_ISA_NS {
namespace {

constexpr int kTileN = 16;  // keys per tile (a tile ends early at a page block boundary)
constexpr int kPad = 16;    // head dim padded to a multiple of this in the fp32 scratch rows
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct bf16_t {
  uint16_t x;
};
struct fp16_t {
  uint16_t x;
};

// ---- scalar conversions --------------------------------------------------------------------

inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float to_f32(float v) { return v; }
inline float to_f32(bf16_t v) { return bits_to_f32(uint32_t(v.x) << 16); }
inline float to_f32(fp16_t v) {
#if defined(VENDORED_CPU_ISA_AVX2) || defined(VENDORED_CPU_ISA_AVX512)
  return _cvtsh_ss(v.x);
#else
  const uint32_t sign = uint32_t(v.x & 0x8000u) << 16;
  const uint32_t exp = (v.x >> 10) & 0x1fu, man = v.x & 0x3ffu;
  if (exp == 0) {
    const float mag = float(man) * 5.9604644775390625e-8f;  // subnormal: man * 2^-24
    return bits_to_f32(f32_to_bits(mag) | sign);
  }
  if (exp == 31) return bits_to_f32(sign | 0x7f800000u | (man << 13));
  return bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
#endif
}

template <typename T>
T from_f32(float f);
template <>
inline float from_f32<float>(float f) {
  return f;
}
template <>
inline bf16_t from_f32<bf16_t>(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{uint16_t((u >> 16) | 0x40u)};  // nan stays nan
  u += 0x7fffu + ((u >> 16) & 1u);                                                  // round to nearest even
  return bf16_t{uint16_t(u >> 16)};
}
template <>
inline fp16_t from_f32<fp16_t>(float f) {
#if defined(VENDORED_CPU_ISA_AVX2) || defined(VENDORED_CPU_ISA_AVX512)
  return fp16_t{uint16_t(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT))};
#else
  uint32_t x = f32_to_bits(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return fp16_t{uint16_t(sign | 0x7e00u)};
  if (x >= 0x477ff000u) return fp16_t{uint16_t(sign | 0x7c00u)};  // rounds to inf
  if (x < 0x38800000u) {                                          // fp16 subnormal or zero
    return fp16_t{uint16_t(sign | uint16_t(std::nearbyint(bits_to_f32(x) * 16777216.0f)))};
  }
  uint32_t h = (((x >> 23) - 112u) << 10) | ((x >> 13) & 0x3ffu);
  const uint32_t rest = x & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return fp16_t{uint16_t(sign | h)};
#endif
}

// ---- row primitives (dst/src rows padded to a multiple of kPad with zeros) --------------------

template <typename T>
inline void load_row(const T* __restrict__ src, float* __restrict__ dst, int d, int dp) {
  int i = 0;
#if defined(VENDORED_CPU_ISA_AVX512)
  if constexpr (std::is_same_v<T, bf16_t>) {
    for (; i + 16 <= d; i += 16) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
      _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)));
    }
  } else if constexpr (std::is_same_v<T, fp16_t>) {
    for (; i + 16 <= d; i += 16)
      _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  }
#elif defined(VENDORED_CPU_ISA_AVX2)
  if constexpr (std::is_same_v<T, bf16_t>) {
    for (; i + 8 <= d; i += 8) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16)));
    }
  } else if constexpr (std::is_same_v<T, fp16_t>) {
    for (; i + 8 <= d; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
#endif
  for (; i < d; ++i) dst[i] = to_f32(src[i]);
  for (; i < dp; ++i) dst[i] = 0.f;
}

#if !defined(VENDORED_CPU_ISA_AVX512)
inline float dot(const float* __restrict__ a, const float* __restrict__ b, int dp) {
  float acc[kPad] = {};
  for (int i = 0; i < dp; i += kPad)
    for (int u = 0; u < kPad; ++u) acc[u] += a[i + u] * b[i + u];
  float s = 0.f;
  for (int u = 0; u < kPad; ++u) s += acc[u];
  return s;
}
#endif

#if defined(VENDORED_CPU_ISA_AVX512)
// out lane j = sum of the 16 lanes of v[j]: a transposing reduction tree (15 adds for 16 rows
// instead of 16 separate horizontal sums).
inline __m512 hsum16(__m512 v[16]) {
  __m512 t[8], u[4];
  for (int i = 0; i < 8; ++i)
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
    u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  const __m512 x01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
  const __m512 x23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, 0x88), _mm512_shuffle_f32x4(x01, x23, 0xDD));
}

// s[jj] = q . k[jj] for the 16 rows of a key tile, bf16 inputs, vdpbf16ps (rows past the tile point
// at zeros). d is a multiple of 8.
inline void scores16_bf16(const bf16_t* q, const bf16_t* const* k, int d, float* s) {
  __m512 acc[16];
  for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
  for (int c = 0; c < d; c += 32) {
    const __mmask32 m = d - c >= 32 ? ~__mmask32(0) : static_cast<__mmask32>((1ull << (d - c)) - 1);
    const __m512bh qc = reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(m, q + c));
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j)
      acc[j] = _mm512_dpbf16_ps(acc[j], qc, reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(m, k[j] + c)));
  }
  _mm512_storeu_ps(s, hsum16(acc));
}

// The same over fp32 rows padded to dp (a multiple of 16).
inline void scores16_f32(const float* q, const float* k, int dp, float* s) {
  __m512 acc[16];
  for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
  for (int c = 0; c < dp; c += 16) {
    const __m512 qc = _mm512_loadu_ps(q + c);
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) acc[j] = _mm512_fmadd_ps(qc, _mm512_loadu_ps(k + size_t(j) * dp + c), acc[j]);
  }
  _mm512_storeu_ps(s, hsum16(acc));
}

// o += sum_j p[j] * v[j] over nk fp32 rows padded to dp, o kept in registers 64 floats at a time.
inline void pv_tile(const float* p, const float* v, int nk, int dp, float* o) {
  for (int c = 0; c < dp; c += 64) {
    const int n = std::min(4, (dp - c) / 16);
    __m512 a0 = _mm512_loadu_ps(o + c);
    __m512 a1 = n > 1 ? _mm512_loadu_ps(o + c + 16) : _mm512_setzero_ps();
    __m512 a2 = n > 2 ? _mm512_loadu_ps(o + c + 32) : _mm512_setzero_ps();
    __m512 a3 = n > 3 ? _mm512_loadu_ps(o + c + 48) : _mm512_setzero_ps();
    for (int j = 0; j < nk; ++j) {
      const __m512 pj = _mm512_set1_ps(p[j]);
      const float* vj = v + size_t(j) * dp + c;
      a0 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj), a0);
      if (n > 1) a1 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj + 16), a1);
      if (n > 2) a2 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj + 32), a2);
      if (n > 3) a3 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj + 48), a3);
    }
    _mm512_storeu_ps(o + c, a0);
    if (n > 1) _mm512_storeu_ps(o + c + 16, a1);
    if (n > 2) _mm512_storeu_ps(o + c + 32, a2);
    if (n > 3) _mm512_storeu_ps(o + c + 48, a3);
  }
}

// 16 bf16 values widened to fp32 (exact: the bits shifted into the high half), the last `n` < 16
// lanes of a short chunk zero.
inline __m512 widen_bf16(const bf16_t* src, __mmask16 m) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, src)), 16));
}

// pv_tile for NR rows of one kv head at once, over the bf16 value rows v[0..nk) read in place: per
// element of o the same fmadd(p[j], v[j][c], o[c]) in the same j order as pv_tile over load_row'd
// rows (so the same bits), but each value chunk is widened once for the NR rows and their NR * NC
// accumulator chains interleave. o rows are padded to a multiple of 16 floats; columns d .. of o
// get 0 * p added, as pv_tile's zero padding does.
template <int NR, int NC>
inline void pv_rows_bf16(const float* const* p, const bf16_t* const* v, int nk, int c, int d, float* const* o) {
  __m512 acc[NR][NC];
  __mmask16 mask[NC];
#pragma GCC unroll 4
  for (int u = 0; u < NC; ++u) {
    const int left = d - c - 16 * u;
    mask[u] = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
  }
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
    for (int u = 0; u < NC; ++u) acc[r][u] = _mm512_loadu_ps(o[r] + c + 16 * u);
  for (int j = 0; j < nk; ++j) {
    __m512 vj[NC];
#pragma GCC unroll 4
    for (int u = 0; u < NC; ++u) vj[u] = widen_bf16(v[j] + c + 16 * u, mask[u]);
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const __m512 pj = _mm512_set1_ps(p[r][j]);
#pragma GCC unroll 4
      for (int u = 0; u < NC; ++u) acc[r][u] = _mm512_fmadd_ps(pj, vj[u], acc[r][u]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
    for (int u = 0; u < NC; ++u) _mm512_storeu_ps(o[r] + c + 16 * u, acc[r][u]);
}

template <int NR>
inline void pv_rows_bf16_cols(const float* const* p, const bf16_t* const* v, int nk, int d, float* const* o) {
  int c = 0;
  for (; c + 64 <= d; c += 64) pv_rows_bf16<NR, 4>(p, v, nk, c, d, o);
  switch ((d - c + 15) / 16) {  // the last 8 .. 56 columns (d is a multiple of 8)
    case 1:
      pv_rows_bf16<NR, 1>(p, v, nk, c, d, o);
      break;
    case 2:
      pv_rows_bf16<NR, 2>(p, v, nk, c, d, o);
      break;
    case 3:
      pv_rows_bf16<NR, 3>(p, v, nk, c, d, o);
      break;
    default:
      break;
  }
}

// o_r += sum_j p_r[j] * v[j] for n rows (row i: p[i], o[i]), up to 4 at a time.
inline void pv_bf16(const float* const* p, const bf16_t* const* v, int nk, int d, float* const* o, int n) {
  int i = 0;
  for (; i + 4 <= n; i += 4) pv_rows_bf16_cols<4>(p + i, v, nk, d, o + i);
  switch (n - i) {
    case 3:
      pv_rows_bf16_cols<3>(p + i, v, nk, d, o + i);
      break;
    case 2:
      pv_rows_bf16_cols<2>(p + i, v, nk, d, o + i);
      break;
    case 1:
      pv_rows_bf16_cols<1>(p + i, v, nk, d, o + i);
      break;
    default:
      break;
  }
}
#else
// o += sum_j p[j] * v[j] over nk fp32 rows padded to dp, 16 floats of o at a time.
inline void pv_tile(const float* p, const float* v, int nk, int dp, float* o) {
  for (int c = 0; c < dp; c += kPad) {
    float acc[kPad];
    for (int u = 0; u < kPad; ++u) acc[u] = o[c + u];
    for (int j = 0; j < nk; ++j) {
      const float pj = p[j];
      const float* vj = v + size_t(j) * dp + c;
      for (int u = 0; u < kPad; ++u) acc[u] += pj * vj[u];
    }
    for (int u = 0; u < kPad; ++u) o[c + u] = acc[u];
  }
}
#endif

inline void axpy(float a, const float* __restrict__ x, float* __restrict__ y, int dp) {
  for (int i = 0; i < dp; ++i) y[i] += a * x[i];
}

inline void scale_row(float a, float* __restrict__ y, int dp) {
  for (int i = 0; i < dp; ++i) y[i] *= a;
}

// exp over one tile of scores, polynomial (Cephes expf coefficients), written so the compiler
// vectorizes it for every ISA; exp(-inf) is exactly 0 (masked keys).
inline void exp_tile(const float* x, float m, float* y) {
  for (int u = 0; u < kTileN; ++u) {
    const float v = std::min(std::max(x[u] - m, -87.33654f), 88.72283f);
    const float t = v * 1.44269504088896341f + 12582912.0f;  // round to nearest via 1.5 * 2^23
    const float n = t - 12582912.0f;
    const float r = (v - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t e = static_cast<int32_t>(n) + 127;
    const float scale = bits_to_f32(static_cast<uint32_t>(e > 0 ? e : 0) << 23);
    y[u] = x[u] == kNegInf ? 0.f : p * scale;
  }
}

}  // namespace
}  // namespace VENDORED_CPU_ISA_NS
}  // namespace flash
