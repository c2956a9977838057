// deep_gemm/csrc/cpu/gemm_kernels.cpp
// The CPU GEMM kernel, built three times (VENDORED_CPU_ISA_NS = cpu_base, cpu_avx2, cpu_avx512).
//
// Decode-sized problems (few rows of A) are a memory-bound GEMV over B: each 128-wide K block of
// one row of B is loaded once, converted to fp32 in registers and used for every row of A; its
// block scale is applied to the block's partial sums, which are then accumulated in fp32.
//
// e4m3 -> fp32 in registers: sign-extending a byte to 16 bits, shifting it left by 7 and clearing
// bit 14 gives the fp16 number with the same sign, exponent field and mantissa, i.e. the e4m3
// value times 2^-8 (subnormals included: fp16 subnormals cover them exactly). F16C converts
// that to fp32 and the 2^8 joins the block scale. The bit pattern of e4m3's NaN (S.1111.111)
// would become a finite fp16 number, so NaN bytes are detected on the side and make the outputs
// of that row NaN, as the exact conversion would.
#include <cmath>
#include <cstring>
#include <vector>

#if defined(VENDORED_CPU_ISA_AVX2) || defined(VENDORED_CPU_ISA_AVX512)
// GCC 12's intrinsic headers self-initialize their undefined-value placeholders (`__Y = __Y`),
// which -Wmaybe-uninitialized reports at every inlined use
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#endif

#include "csrc/cpu/kernels.hpp"
#include "csrc/utils/fp8.hpp"

#ifndef VENDORED_CPU_ISA_NS
#define VENDORED_CPU_ISA_NS cpu_base
#endif

namespace deep_gemm::VENDORED_CPU_ISA_NS {
namespace {

constexpr int kBlockK = 128;
constexpr float kFp8Shift = 256.0f;  // the fp16 trick yields value * 2^-8

#if defined(VENDORED_CPU_ISA_AVX512)
struct Vec {
  using R = __m512;
  static constexpr int W = 16;
  static R zero() { return _mm512_setzero_ps(); }
  static R set1(float x) { return _mm512_set1_ps(x); }
  static R load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, R v) { _mm512_storeu_ps(p, v); }
  static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
  static R add(R a, R b) { return _mm512_add_ps(a, b); }
  static R fma(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
  static float hsum(R v) { return _mm512_reduce_add_ps(v); }
  // 128 e4m3 bytes -> 8 vectors of value * 2^-8; returns true when a NaN byte was seen
  static bool fp8_block(const uint8_t* p, R* w) {
    const __m256i low7 = _mm256_set1_epi8(0x7F);
    const __m512i keep = _mm512_set1_epi16(static_cast<short>(0xBF80));
    __mmask32 nan = 0;
    for (int j = 0; j < 4; ++j) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * j));
      nan |= _mm256_cmpeq_epi8_mask(_mm256_and_si256(raw, low7), low7);
      const __m512i h = _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(raw), 7), keep);
      w[2 * j] = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
      w[2 * j + 1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
    }
    return nan != 0;
  }
  static void bf16_block(const uint16_t* p, R* w) {
    for (int j = 0; j < 8; ++j) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 * j));
      w[j] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    }
  }
};
#elif defined(VENDORED_CPU_ISA_AVX2)
struct Vec {
  using R = __m256;
  static constexpr int W = 8;
  static R zero() { return _mm256_setzero_ps(); }
  static R set1(float x) { return _mm256_set1_ps(x); }
  static R load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, R v) { _mm256_storeu_ps(p, v); }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static R add(R a, R b) { return _mm256_add_ps(a, b); }
  static R fma(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
  static float hsum(R v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static bool fp8_block(const uint8_t* p, R* w) {
    const __m128i low7 = _mm_set1_epi8(0x7F);
    const __m256i keep = _mm256_set1_epi16(static_cast<short>(0xBF80));
    int nan = 0;
    for (int j = 0; j < 8; ++j) {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * j));
      nan |= _mm_movemask_epi8(_mm_cmpeq_epi8(_mm_and_si128(raw, low7), low7));
      const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(raw), 7), keep);
      w[2 * j] = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
      w[2 * j + 1] = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
    }
    return nan != 0;
  }
  static void bf16_block(const uint16_t* p, R* w) {
    for (int j = 0; j < 16; ++j) {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8 * j));
      w[j] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
    }
  }
};
#else
// e4m3 byte -> value * 2^-8 (exact; NaN stays NaN)
struct Fp8Table {
  float v[256];
  Fp8Table() {
    for (int i = 0; i < 256; ++i) v[i] = e4m3_to_float(static_cast<uint8_t>(i)) / kFp8Shift;
  }
};
const Fp8Table& fp8_table() {
  static const Fp8Table t;
  return t;
}

// portable: one lane, exact table conversion (NaN propagates through the arithmetic itself)
struct Vec {
  using R = float;
  static constexpr int W = 1;
  static R zero() { return 0.0f; }
  static R set1(float x) { return x; }
  static R load(const float* p) { return *p; }
  static void store(float* p, R v) { *p = v; }
  static R mul(R a, R b) { return a * b; }
  static R add(R a, R b) { return a + b; }
  static R fma(R a, R b, R c) { return a * b + c; }
  static float hsum(R v) { return v; }
  static bool fp8_block(const uint8_t* p, R* w) {
    const float* t = fp8_table().v;
    for (int j = 0; j < kBlockK; ++j) w[j] = t[p[j]];
    return false;
  }
  static void bf16_block(const uint16_t* p, R* w) {
    for (int j = 0; j < kBlockK; ++j) w[j] = bf16_to_float(p[j]);
  }
};
#endif

constexpr int kNumVecs = kBlockK / Vec::W;
constexpr int64_t kRowTile = 32;  // rows of A per pass over B (bounds the A working set)

inline float load_any(const void* p, DType t, int64_t i) {
  return t == DType::kFloat32 ? static_cast<const float*>(p)[i] : bf16_to_float(static_cast<const uint16_t*>(p)[i]);
}

inline void store_any(void* p, DType t, int64_t i, float v) {
  if (t == DType::kFloat32) {
    static_cast<float*>(p)[i] = v;
  } else {
    static_cast<uint16_t*>(p)[i] = float_to_bf16(v);
  }
}

template <bool kFp8>
void rows_impl(const cpu::GemmParams& p, int64_t n_begin, int64_t n_end) {
  using R = Vec::R;
  constexpr int W = Vec::W;
  const int64_t k_blocks = (p.k + kBlockK - 1) / kBlockK;
  const int64_t k_tail = p.k % kBlockK;  // a partial last block is read from a zero-padded copy
  std::vector<float> total(static_cast<size_t>(kRowTile * W));
  alignas(64) uint8_t pad8[kBlockK] = {};
  alignas(64) uint16_t pad16[kBlockK] = {};

  for (int64_t m0 = 0; m0 < p.m; m0 += kRowTile) {
    const int64_t mt = p.m - m0 < kRowTile ? p.m - m0 : kRowTile;
    const float* a_tile = p.a + m0 * p.lda;
    for (int64_t n = n_begin; n < n_end; ++n) {
      std::memset(total.data(), 0, sizeof(float) * static_cast<size_t>(mt * W));
      const float* sfb_row = kFp8 ? p.sfb + (n / p.sfb_gran_n) * p.sfb_s0 : nullptr;
      bool nan = false;
      for (int64_t kb = 0; kb < k_blocks; ++kb) {
        const bool partial = k_tail && kb == k_blocks - 1;
        R w[kNumVecs];
        float scale = 1.0f;
        if constexpr (kFp8) {
          const uint8_t* src = static_cast<const uint8_t*>(p.b) + n * p.ldb + kb * kBlockK;
          if (partial) src = static_cast<const uint8_t*>(std::memcpy(pad8, src, static_cast<size_t>(k_tail)));
          nan |= Vec::fp8_block(src, w);
          scale = sfb_row[kb * p.sfb_s1] * kFp8Shift;
        } else {
          const uint16_t* src = static_cast<const uint16_t*>(p.b) + n * p.ldb + kb * kBlockK;
          if (partial) src = static_cast<const uint16_t*>(std::memcpy(pad16, src, static_cast<size_t>(k_tail) * 2));
          Vec::bf16_block(src, w);
        }
        const R s = Vec::set1(scale);
        for (int64_t m = 0; m < mt; ++m) {
          const float* ap = a_tile + m * p.lda + kb * kBlockK;
          R acc0 = Vec::mul(Vec::load(ap), w[0]);
          R acc1 = Vec::mul(Vec::load(ap + W), w[1]);
#pragma GCC unroll 16
          for (int j = 2; j < kNumVecs; j += 2) {
            acc0 = Vec::fma(Vec::load(ap + j * W), w[j], acc0);
            acc1 = Vec::fma(Vec::load(ap + (j + 1) * W), w[j + 1], acc1);
          }
          float* t = total.data() + m * W;
          Vec::store(t, Vec::fma(Vec::add(acc0, acc1), s, Vec::load(t)));
        }
      }
      for (int64_t m = 0; m < mt; ++m) {
        float v = Vec::hsum(Vec::load(total.data() + m * W));
        if (nan) v = std::nanf("");
        const int64_t row = m0 + m;
        if (p.c) v += load_any(p.c, p.c_dtype, row * p.ldc0 + n * p.ldc1);
        store_any(p.d, p.d_dtype, row * p.ldd0 + n * p.ldd1, v);
      }
    }
  }
}

#if defined(VENDORED_CPU_ISA_AVX512)
// FP8 B with AVX512-BF16 dot products: sign-extending an e4m3 byte to 16 bits, shifting it left by 4 and
// keeping bits 15 and 4..10 gives the bf16 number with the same sign, exponent field and mantissa, i.e. the
// value times 2^-120 (3 ops per 32 weights); vdpbf16ps then does 32 multiply-adds per instruction against A's
// exact bf16 copy (times 2^64). e4m3 subnormals of B would become bf16 subnormals, which vdpbf16ps reads
// as zero: a block holding one (about 1 in 60 on SmolLM2's weights) goes through the exact fp16 path instead.
constexpr float kBf16DotShift = 72057594037927936.0f;  // 2^120 / 2^64 = 2^56

void rows_fp8_bf16dot(const cpu::GemmParams& p, int64_t n_begin, int64_t n_end) {
  const int64_t k_blocks = p.lda / kBlockK;
  const int64_t k_tail = p.k % kBlockK;
  const __m512i keep = _mm512_set1_epi16(static_cast<short>(0x87F0));
  const __m512i low7 = _mm512_set1_epi8(0x7F);
  const __m512i exp4 = _mm512_set1_epi8(0x78);
  const __m512i man3 = _mm512_set1_epi8(0x07);
  std::vector<float> total(static_cast<size_t>(kRowTile * 16));
  alignas(64) uint8_t pad8[kBlockK] = {};
  for (int64_t m0 = 0; m0 < p.m; m0 += kRowTile) {
    const int64_t mt = p.m - m0 < kRowTile ? p.m - m0 : kRowTile;
    for (int64_t n = n_begin; n < n_end; ++n) {
      std::memset(total.data(), 0, sizeof(float) * static_cast<size_t>(mt * 16));
      const float* sfb_row = p.sfb + (n / p.sfb_gran_n) * p.sfb_s0;
      __mmask64 nan = 0;
      for (int64_t kb = 0; kb < k_blocks; ++kb) {
        const uint8_t* src = static_cast<const uint8_t*>(p.b) + n * p.ldb + kb * kBlockK;
        if (k_tail && kb == k_blocks - 1)
          src = static_cast<const uint8_t*>(std::memcpy(pad8, src, static_cast<size_t>(k_tail)));
        __m512bh w[4];
        __mmask64 subnormal = 0;
        for (int j = 0; j < 2; ++j) {
          const __m512i raw = _mm512_loadu_si512(src + 64 * j);
          nan |= _mm512_cmpeq_epi8_mask(_mm512_and_si512(raw, low7), low7);
          subnormal |= _mm512_mask_test_epi8_mask(_mm512_testn_epi8_mask(raw, exp4), raw, man3);
          const __m512i lo = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(raw));
          const __m512i hi = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(raw, 1));
          w[2 * j] = (__m512bh)_mm512_and_si512(_mm512_slli_epi16(lo, 4), keep);
          w[2 * j + 1] = (__m512bh)_mm512_and_si512(_mm512_slli_epi16(hi, 4), keep);
        }
        if (subnormal) {  // exact: fp16 decode, fp32 FMA against A dequantized
          __m512 wf[kNumVecs];
          Vec::fp8_block(src, wf);
          const __m512 s = _mm512_set1_ps(sfb_row[kb * p.sfb_s1] * kFp8Shift);
          for (int64_t m = 0; m < mt; ++m) {
            const float* ap = p.a + (m0 + m) * p.lda + kb * kBlockK;
            __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(ap), wf[0]);
            for (int j = 1; j < kNumVecs; ++j) acc = _mm512_fmadd_ps(_mm512_loadu_ps(ap + 16 * j), wf[j], acc);
            float* t = total.data() + m * 16;
            _mm512_storeu_ps(t, _mm512_fmadd_ps(acc, s, _mm512_loadu_ps(t)));
          }
          continue;
        }
        const float sb = sfb_row[kb * p.sfb_s1] * kBf16DotShift;
        for (int64_t m = 0; m < mt; ++m) {
          const uint16_t* ap = p.a16 + (m0 + m) * p.lda + kb * kBlockK;
          __m512 acc0 = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)_mm512_loadu_si512(ap), w[0]);
          __m512 acc1 = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)_mm512_loadu_si512(ap + 32), w[1]);
          acc0 = _mm512_dpbf16_ps(acc0, (__m512bh)_mm512_loadu_si512(ap + 64), w[2]);
          acc1 = _mm512_dpbf16_ps(acc1, (__m512bh)_mm512_loadu_si512(ap + 96), w[3]);
          const __m512 s = _mm512_set1_ps(sb * p.sfa[(m0 + m) * k_blocks + kb]);
          float* t = total.data() + m * 16;
          _mm512_storeu_ps(t, _mm512_fmadd_ps(_mm512_add_ps(acc0, acc1), s, _mm512_loadu_ps(t)));
        }
      }
      for (int64_t m = 0; m < mt; ++m) {
        float v = _mm512_reduce_add_ps(_mm512_loadu_ps(total.data() + m * 16));
        if (nan) v = std::nanf("");
        const int64_t row = m0 + m;
        if (p.c) v += load_any(p.c, p.c_dtype, row * p.ldc0 + n * p.ldc1);
        store_any(p.d, p.d_dtype, row * p.ldd0 + n * p.ldd1, v);
      }
    }
  }
}
#endif

}  // namespace

void gemm_nt_rows(const cpu::GemmParams& p, int64_t n_begin, int64_t n_end) {
#if defined(VENDORED_CPU_ISA_AVX512)
  if (p.b_dtype == DType::kFloat8E4M3 && p.a16 != nullptr) return rows_fp8_bf16dot(p, n_begin, n_end);
#endif
  if (p.b_dtype == DType::kFloat8E4M3) {
    rows_impl<true>(p, n_begin, n_end);
  } else {
    rows_impl<false>(p, n_begin, n_end);
  }
}

}  // namespace deep_gemm::VENDORED_CPU_ISA_NS
