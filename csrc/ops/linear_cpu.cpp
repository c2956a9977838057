// keel/csrc/ops/linear_cpu.cpp
// CPU kernel of keel::linear for few rows (compiled once per ISA, no torch header).
// Each weight row is read front to back, once for all m rows: one sequential stream that the
// hardware prefetcher follows, plus a software prefetch ahead (how it compares with oneDNN's
// prepacked GEMV: docs/measurements/2026-12-01-generate-vs-transformers.md). Up to 4 x rows share each weight
// load (more rows loop over groups of 4, re-reading the row from L1), with KU independent accumulators per row.
//   AVX2 build: GCC vector extensions (ymm FMA; bf16 -> fp32 is a 16-bit shift); the baseline build
//     gets the same code as SSE pairs.
//   bf16 on a CPU with AVX512-BF16 (checked at run time): vdpbf16ps, 32 multiply-adds per instruction
//     with no conversion (products exact, fp32 sums), on tiles of up to 4 x rows times 4 weight rows.
//
// Summation order (a row's bits must not depend on the call it is in): every output of a build is
// summed in ONE order whatever the call's row count, the row's place in it, the thread count or how output
// features are split, so a token gives the same bits in a prompt call, with a cached prefix, batched with
// other sequences or alone, and in a decode call.
//   portable (fp32, fp16, and bf16 without AVX512-BF16): 8-lane vectors (SSE pairs in the baseline build),
//     kKU accumulators taking the 8-column steps round robin, added in order, the 8 lanes in hsum's tree,
//     then the columns past the last whole kKU * 8 step one by one, then the bias; one rounding.
//   AVX512-BF16: one accumulator per output over the 32-column steps in order (the masked tail last), the 16
//     lanes in hsum16's tree, then the bias; one rounding.
// The order depends on the ISA build (results differ between KEEL_CPU_ISA levels), never on the call.
#include <cstring>

#include "ops/linear.h"
#include "ops/vec_sum.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

// the vector helpers are always inlined, so the baseline build's vector-ABI note does not apply
#pragma GCC diagnostic ignored "-Wpsabi"

namespace keel::KEEL_CPU_NS {
namespace {

using vec::f32x8;
using vec::hsum8;
typedef uint16_t u16x8 __attribute__((vector_size(16)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));

constexpr int64_t kPrefetchBytes = 8192;  // how far ahead of the current weight column to prefetch (portable)
// The AVX512-BF16 kernel asks for the weight lines 16 KB ahead into the outer caches (prefetcht2) and for none
// into L1: faster with cold weights than prefetcht0 8 KB ahead, most at several rows
// (docs/measurements/2026-12-03-prefetch.md)
constexpr int64_t kFarPrefetchBytes = 16384;

KEEL_KINLINE f32x8 load8(const float* p) {
  f32x8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

KEEL_KINLINE f32x8 load8(const bf16_t* p) {
  u16x8 h;
  std::memcpy(&h, p, sizeof(h));
  const u32x8 u = __builtin_convertvector(h, u32x8) << 16;
  f32x8 v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}

KEEL_KINLINE f32x8 load8(const f16_t* p) {
#if defined(__F16C__)
  typedef _Float16 f16x8 __attribute__((vector_size(16)));
  f16x8 h;
  std::memcpy(&h, p, sizeof(h));
  return __builtin_convertvector(h, f32x8);
#else
  f32x8 v;
  for (int i = 0; i < 8; ++i) v[i] = load(p + i);
  return v;
#endif
}

// x rows [m0, m0 + MR) times weight row r: 8 columns a step, KU steps unrolled.
template <int MR, int KU, typename T>
KEEL_KINLINE void row_tile(const LinearParams& p, int64_t m0, int64_t r) {
  const int64_t k = p.k;
  const float* x = p.x + m0 * k;
  const T* w = static_cast<const T*>(p.w) + r * p.w_row;
  constexpr int64_t ahead = kPrefetchBytes / sizeof(T);
  f32x8 acc[MR][KU];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) {
#pragma GCC unroll 8
    for (int u = 0; u < KU; ++u) acc[m][u] = f32x8{};
  }
  int64_t i = 0;
  for (; i + 8 * KU <= k; i += 8 * KU) {
#pragma GCC unroll 8
    for (int u = 0; u < KU; ++u) {
      if ((8 * u * sizeof(T)) % 64 == 0) __builtin_prefetch(w + i + ahead + 8 * u);  // once per cache line
      const f32x8 wv = load8(w + i + 8 * u);
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) acc[m][u] += load8(x + m * k + i + 8 * u) * wv;
    }
  }
  T* out = static_cast<T*>(p.out);
  const T* bias = static_cast<const T*>(p.bias);
  for (int m = 0; m < MR; ++m) {
#pragma GCC unroll 8
    for (int u = 1; u < KU; ++u) acc[m][0] += acc[m][u];
    float s = hsum8(acc[m][0]);
    for (int64_t t = i; t < k; ++t) s += x[m * k + t] * load(w + t);
    if (bias) s += load(bias + r * p.bias_stride);
    store(out + (m0 + m) * p.n + r, s);
  }
}

// Accumulators per x row of the portable kernel: the same for every row count (it fixes the summation order).
// 2: 4 x rows x 2 fill the 16 ymm registers' budget with the weight and x vectors; 1-row decode runs two
// FMA chains (fp32 decode streams the weight at 32 bytes per FMA, far past memory bandwidth).
constexpr int kKU = 2;

#if defined(__AVX2__)
// Prompts on AVX2: MR rows of x times two weight rows per pass, each output summed exactly as row_tile<*, kKU> sums it
// (kKU accumulators from zero taking the 8-column steps round robin, each step one FMA, added in order, hsum8, the
// columns past the last whole step one by one, the bias): the same bits, with 2 * MR * kKU chains side by side and
// each weight vector converted once for MR rows (row_tile reloads and converts it for every group of x rows).
static_assert(kKU == 2, "tile_mx2 keeps two accumulators per output");

KEEL_KINLINE __m256 wload8(const float* p) { return _mm256_loadu_ps(p); }
KEEL_KINLINE __m256 wload8(const bf16_t* p) {
  const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}
KEEL_KINLINE __m256 wload8(const f16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

template <int MR, typename T>
KEEL_KINLINE void tile_mx2(const LinearParams& p, int64_t m0, int64_t r0) {
  const int64_t k = p.k;
  const float* x = p.x + m0 * k;
  const T* w[2] = {static_cast<const T*>(p.w) + r0 * p.w_row, static_cast<const T*>(p.w) + (r0 + 1) * p.w_row};
  constexpr int64_t ahead = kPrefetchBytes / sizeof(T);
  __m256 acc[MR][2][kKU];
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m) {
    for (int j = 0; j < 2; ++j) acc[m][j][0] = acc[m][j][1] = _mm256_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 8 * kKU <= k; i += 8 * kKU) {
#pragma GCC unroll 2
    for (int u = 0; u < kKU; ++u) {
      if ((8 * u * sizeof(T)) % 64 == 0) {
        __builtin_prefetch(w[0] + i + ahead + 8 * u);
        __builtin_prefetch(w[1] + i + ahead + 8 * u);
      }
      const __m256 w0 = wload8(w[0] + i + 8 * u);
      const __m256 w1 = wload8(w[1] + i + 8 * u);
#pragma GCC unroll 4
      for (int m = 0; m < MR; ++m) {
        const __m256 xv = _mm256_loadu_ps(x + m * k + i + 8 * u);
        acc[m][0][u] = _mm256_fmadd_ps(xv, w0, acc[m][0][u]);
        acc[m][1][u] = _mm256_fmadd_ps(xv, w1, acc[m][1][u]);
      }
    }
  }
  T* out = static_cast<T*>(p.out);
  const T* bias = static_cast<const T*>(p.bias);
  for (int m = 0; m < MR; ++m) {
    for (int j = 0; j < 2; ++j) {
      f32x8 a;
      const __m256 sum = _mm256_add_ps(acc[m][j][0], acc[m][j][1]);
      std::memcpy(&a, &sum, sizeof(a));
      float s = hsum8(a);
      for (int64_t t = i; t < k; ++t) s += x[m * k + t] * load(w[j] + t);
      if (bias) s += load(bias + (r0 + j) * p.bias_stride);
      store(out + (m0 + m) * p.n + r0 + j, s);
    }
  }
}

// Weight rows [r0, r1) (an even count) against every row of x: the rows of x 3 at a time (a tile's rows stay in L1),
// each against the range's weight rows two by two (the range is kept small enough to stay in L1 too).
template <typename T>
void rows_pairs(const LinearParams& p, int64_t r0, int64_t r1) {
  int64_t m0 = 0;
  for (; m0 + 3 <= p.m; m0 += 3) {
    for (int64_t r = r0; r < r1; r += 2) tile_mx2<3, T>(p, m0, r);
  }
  for (int64_t r = r0; r < r1; r += 2) {
    if (p.m - m0 == 2) tile_mx2<2, T>(p, m0, r);
    if (p.m - m0 == 1) tile_mx2<1, T>(p, m0, r);
  }
}

constexpr int64_t kPairsBytes = 16384;  // weight bytes of one range of rows_pairs
#endif

template <typename T>
void cols_impl(const LinearParams& p, int64_t begin, int64_t end) {
#if defined(__AVX2__)
  if (p.m >= 2) {  // prompts and batched decode: two weight rows per pass
    const int64_t bytes = p.k * static_cast<int64_t>(sizeof(T));
    const int64_t chunk = bytes == 0 || bytes * 2 >= kPairsBytes ? 2 : kPairsBytes / bytes / 2 * 2;
    int64_t r = begin;
    for (; r + 2 <= end; r += chunk) {
      const int64_t r1 = r + chunk <= end ? r + chunk : r + (end - r) / 2 * 2;
      rows_pairs<T>(p, r, r1);
      if (r1 < r + chunk) {
        r = r1;
        break;
      }
    }
    begin = r;
  }
#endif
  for (int64_t r = begin; r < end; ++r) {
    int64_t m0 = 0;
    for (; m0 + 4 <= p.m; m0 += 4) row_tile<4, kKU, T>(p, m0, r);
    switch (p.m - m0) {
      case 3:
        row_tile<3, kKU, T>(p, m0, r);
        break;
      case 2:
        row_tile<2, kKU, T>(p, m0, r);
        break;
      case 1:
        row_tile<1, kKU, T>(p, m0, r);
        break;
      default:
        break;
    }
  }
}

#if defined(__AVX2__)
#define KEEL_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

using vec::hsum16;
using vec::hsum16x16;
using vec::round_bf16;

// MR x rows times NR weight rows, 32 columns a step, one accumulator per output (MR * NR independent dpbf16
// chains), so each step loads MR + NR vectors for MR * NR dot-product steps. Every output is summed in the
// same order whatever its tile (one fp32 accumulator over k, masked tail, then the 16-lane sum), so neither
// the call's row count nor how rows and output features are split changes it. Decode (1-3 x rows) takes one
// weight row at a time (NR = 1), so the weight is read in address order; the chains of consecutive rows
// overlap out of order.
template <int MR, int NR>
KEEL_AVX512BF16 inline void tile_bf16(const LinearParams& p, int64_t m0, int64_t r0) {
  const int64_t k = p.k;
  const uint16_t* x = static_cast<const uint16_t*>(p.x16) + m0 * k;
  const uint16_t* w = static_cast<const uint16_t*>(p.w) + r0 * p.w_row;
  constexpr int64_t ahead = kFarPrefetchBytes / 2;
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    __m512bh wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(w + j * p.w_row + i + ahead), _MM_HINT_T2);
      wv[j] = (__m512bh)_mm512_loadu_si512(w + j * p.w_row + i);
    }
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + m * k + i);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], xv, wv[j]);
    }
  }
  if (i < k) {  // tail: masked loads read zeros past k
    const __mmask32 mask = (__mmask32{1} << (k - i)) - 1;
    __m512bh wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + j * p.w_row + i);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + m * k + i);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], xv, wv[j]);
    }
  }
  bf16_t* out = static_cast<bf16_t*>(p.out);
  const bf16_t* bias = static_cast<const bf16_t*>(p.bias);
  if constexpr (NR == 4) {  // prompts and batched decode: one vector epilogue (rows past MR reduce zeros)
    __m512 v[16];
#pragma GCC unroll 4
    for (int m = 0; m < 4; ++m) {
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) v[4 * j + m] = m < MR ? acc[m < MR ? m : 0][j] : _mm512_setzero_ps();
    }
    __m512 s = hsum16x16(v);  // lane 4m + j: hsum16 of acc[m][j]
    if (bias) {
      alignas(16) float b4[4];
      for (int j = 0; j < 4; ++j) b4[j] = load(bias + (r0 + j) * p.bias_stride);
      s = _mm512_add_ps(s, _mm512_broadcast_f32x4(_mm_load_ps(b4)));
    }
    alignas(32) uint64_t rows[4];  // row m's four bf16 outputs
    _mm256_store_si256(reinterpret_cast<__m256i*>(rows), round_bf16(s));
    for (int m = 0; m < MR; ++m) std::memcpy(out + (m0 + m) * p.n + r0, &rows[m], sizeof(uint64_t));
  } else {  // decode at 1-3 rows: one weight row at a time
    for (int m = 0; m < MR; ++m) {
      for (int j = 0; j < NR; ++j) {
        float s = hsum16(acc[m][j]);
        if (bias) s += load(bias + (r0 + j) * p.bias_stride);
        store(out + (m0 + m) * p.n + r0 + j, s);
      }
    }
  }
}

// The x rows of one weight-row group [r0, r0 + NR): 4 at a time, then the remainder.
template <int NR>
KEEL_AVX512BF16 KEEL_KINLINE void rows_bf16(const LinearParams& p, int64_t r0) {
  int64_t m0 = 0;
  for (; m0 + 4 <= p.m; m0 += 4) tile_bf16<4, NR>(p, m0, r0);
  switch (p.m - m0) {
    case 3:
      tile_bf16<3, NR>(p, m0, r0);
      break;
    case 2:
      tile_bf16<2, NR>(p, m0, r0);
      break;
    case 1:
      tile_bf16<1, NR>(p, m0, r0);
      break;
    default:
      break;
  }
}

KEEL_AVX512BF16 void cols_bf16(const LinearParams& p, int64_t begin, int64_t end) {
  // decode and prompts share tile_bf16's order; only how many weight rows share a step differs
  int64_t r = begin;
  if (p.m >= 4) {
    for (; r + 4 <= end; r += 4) rows_bf16<4>(p, r);  // 4 weight rows: 16 accumulators at 4 x rows
  }
  for (; r < end; ++r) rows_bf16<1>(p, r);
}
#endif  // __AVX2__

}  // namespace

void linear_cols(const LinearParams& p, int64_t begin, int64_t end) {
#if defined(__AVX2__)
  if (p.x16 != nullptr) return cols_bf16(p, begin, end);  // the wrapper chose AVX512-BF16
#endif
  dispatch_storage(p.dtype, [&](auto tag) { cols_impl<decltype(tag)>(p, begin, end); });
}

}  // namespace keel::KEEL_CPU_NS
