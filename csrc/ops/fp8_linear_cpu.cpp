// keel/csrc/ops/fp8_linear_cpu.cpp
// CPU kernel of keel::fp8_linear (compiled once per ISA, no torch header): a GEMV over e4m3 weights that
// streams each weight row once, decoding it in registers, for every row of x of the pass.
//
// e4m3 -> fp32 exactly, in 3 integer ops and one conversion: sign-extending a byte to 16 bits, shifting it
// left by 7 and clearing bit 14 gives the fp16 number with the same sign, exponent field and mantissa,
// i.e. the e4m3 value times 2^-8 (e4m3 subnormals land on fp16 subnormals, also exact); vcvtph2ps widens
// it to fp32 and the 2^8 joins the block scale. e4m3's NaN bytes (S.1111.111) would decode to a finite
// number, so they are detected on the side (a compare per 64 bytes) and make that output row NaN.
//
// Per output, in every build: for each 128-wide K block, acc = x[0:W] * w[0:W], then acc += x[jW:] * w[jW:]
// (FMA, j in order), then total += acc * (scale * 2^8); at the end the W lanes of total are summed in a
// fixed tree, the bias added, and the sum rounded once to the output dtype. W is the vector width of the
// build (16 with AVX-512, 8 otherwise), so results depend on the ISA but never on how rows are split
// among threads or passes, nor on the call's row count or its other rows (the AVX512-BF16 path's choice between its
// bf16 copy of a row and the exact fp32 path is made per row).
//   AVX-512 (AVX512F/BW/VL, checked at run time, in the AVX2 build): 32 weights per 256-bit load.
//   AVX2 build: the same decode on 16 weights (F16C), four weight rows per pass in decode, prompts from a decoded
//   range of weight rows, three rows of x times two weight rows per tile; baseline build: a 256-entry table.
#include <algorithm>
#include <cstring>
#include <vector>

#include "ops/fp8_linear.h"
#include "ops/vec_sum.h"

#if defined(__AVX2__)
// (vec_sum.h, included above, silences GCC 12's intrinsic-header warnings)
#include <immintrin.h>
#endif

#pragma GCC diagnostic ignored "-Wpsabi"

namespace keel::KEEL_CPU_NS {
namespace {

constexpr float kFp8Shift = kFp8Unit;     // the fp16 decode yields value * 2^-8
constexpr int64_t kPrefetchBytes = 2048;  // how far ahead of the current block to prefetch the weight row
// decode also asks for the lines 8 KB ahead into the outer caches (prefetcht2): a token's projections with cold
// weights are faster with it (benchmarks/projections.py; figures in docs/measurements/2026-12-02-llamacpp.md)
constexpr int64_t kFarPrefetchBytes = 8192;

using vec::f32x8;
using vec::hsum8;

template <typename T>
KEEL_KINLINE void store_out(const Fp8LinearParams& p, int64_t row, int64_t r, float s, bool nan) {
  const T* bias = static_cast<const T*>(p.bias);
  if (bias) s += load(bias + r * p.bias_stride);
  if (nan) s = bits_to_float(0x7FC00000u);
  store(static_cast<T*>(p.out) + row * p.n + r, s);
}

KEEL_KINLINE void store_any(const Fp8LinearParams& p, int64_t row, int64_t r, float s, bool nan) {
  dispatch_storage(p.dtype, [&](auto tag) { store_out<decltype(tag)>(p, row, r, s, nan); });
}

KEEL_KINLINE float block_scale(const Fp8LinearParams& p, const float* srow, int64_t b) {
  return srow[b * p.scale_s1] * kFp8Shift;
}

// ---- portable 8-lane version (baseline: table; AVX2: F16C decode) ----------------------------------------

#if defined(__AVX2__)
// 16 e4m3 bytes -> two vectors of value * 2^-8; returns whether a NaN byte was among them
KEEL_KINLINE bool decode16(const uint8_t* p, f32x8* w) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i h =
      _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(raw), 7), _mm256_set1_epi16(static_cast<short>(0xBF80)));
  const __m256 lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
  const __m256 hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
  std::memcpy(&w[0], &lo, sizeof(lo));
  std::memcpy(&w[1], &hi, sizeof(hi));
  const __m128i all = _mm_or_si128(raw, _mm_set1_epi8(static_cast<char>(0x80)));
  return _mm_movemask_epi8(_mm_cmpeq_epi8(all, _mm_set1_epi8(-1))) != 0;
}
#else
struct Fp8Table {
  float v[256];
  Fp8Table() {
    for (int i = 0; i < 256; ++i) {
      const int e = (i >> 3) & 15, m = i & 7;
      float a = e == 0 ? static_cast<float>(m) * (1.0f / 512.0f)  // subnormal: m * 2^-9
                       : (1.0f + static_cast<float>(m) / 8.0f) * static_cast<float>(1 << e) / 128.0f;
      if (e == 15 && m == 7) a = bits_to_float(0x7FC00000u);  // NaN
      v[i] = ((i & 128) ? -a : a) / kFp8Shift;
    }
  }
};
const Fp8Table& fp8_table() {
  static const Fp8Table t;
  return t;
}
KEEL_KINLINE bool decode16(const uint8_t* p, f32x8* w) {
  const float* t = fp8_table().v;
  for (int i = 0; i < 8; ++i) w[0][i] = t[p[i]];
  for (int i = 0; i < 8; ++i) w[1][i] = t[p[8 + i]];
  return false;  // the table's NaN propagates through the arithmetic
}
#endif

KEEL_KINLINE f32x8 load8(const float* p) {
  f32x8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

void cols_portable(const Fp8LinearParams& p, int64_t begin, int64_t end) {
  constexpr int kVecs = kFp8BlockK / 8;
  const int64_t nb = p.kp / kFp8BlockK;
  f32x8 total[kFp8RowBlock];
  alignas(64) uint8_t pad[kFp8BlockK];
  for (int64_t r = begin; r < end; ++r) {
    const uint8_t* wrow = p.w + r * p.w_row;
    const float* srow = p.scale + (r / p.scale_rows) * p.scale_s0;
    bool nan = false;
    for (int64_t i = 0; i < p.m; ++i) total[i] = f32x8{};
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* src = wrow + b * kFp8BlockK;
      const int64_t left = p.k - b * kFp8BlockK;
      if (left < kFp8BlockK) {  // the partial last block, from a zero-padded copy
        std::memset(pad, 0, sizeof(pad));
        std::memcpy(pad, src, static_cast<size_t>(left));
        src = pad;
      }
      f32x8 w[kVecs];
      for (int j = 0; j < kVecs; j += 2) nan |= decode16(src + 8 * j, w + j);
      const float s = block_scale(p, srow, b);
      const f32x8 sv = f32x8{} + s;
      for (int64_t i = 0; i < p.m; ++i) {
        const float* xp = p.x + i * p.kp + b * kFp8BlockK;
        f32x8 acc = load8(xp) * w[0];
#pragma GCC unroll 16
        for (int j = 1; j < kVecs; ++j) acc = load8(xp + 8 * j) * w[j] + acc;
        total[i] = acc * sv + total[i];
      }
    }
    for (int64_t i = 0; i < p.m; ++i) store_any(p, i, r, hsum8(total[i]), nan);
  }
}

// ---- AVX2: several chains side by side -------------------------------------------------------------------------
// One row of x against one weight row is a chain of 16 dependent FMAs per block, bound by the FMA's latency, not by
// the bytes. These kernels compute every output in the order of the file's header with explicit instructions
// (per block: acc = x[0:8] * w[0:8] rounded, then an FMA for each further 8 columns in order, over the 16-column steps
// that hold a column < k (the last one zero-padded past k); total = fma(acc, s, total); hsum8, bias, one rounding), and
// run more chains at once: decode (one row of x) takes kAvx2DecodeRows weight rows per pass, each x vector loaded
// once for all of them; prompts decode a range of weight rows once into a buffer and run tiles of 3 x 2 outputs. Every
// row count takes these kernels in the AVX2 build (cols_portable's vector-extension code leaves the choice of which
// product to fuse to the compiler), so a row's bits never depend on its call.

#if defined(__AVX2__)
constexpr int kAvx2DecodeRows = 4;
constexpr int kSteps = kFp8BlockK / 16;  // 16-weight steps of a block

KEEL_KINLINE __m256 ld8(const float* p) { return _mm256_loadu_ps(p); }

// 16 e4m3 bytes -> two vectors of value * 2^-8 (decode16's arithmetic, without its NaN test)
KEEL_KINLINE void decode16_nonan(const uint8_t* p, __m256& lo, __m256& hi) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i h =
      _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(raw), 7), _mm256_set1_epi16(static_cast<short>(0xBF80)));
  lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
  hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

// Lanes set where a byte of the 16 at p is a NaN (S.1111.111)
KEEL_KINLINE __m128i nan_bytes16(const uint8_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm_cmpeq_epi8(_mm_or_si128(raw, _mm_set1_epi8(static_cast<char>(0x80))), _mm_set1_epi8(-1));
}

KEEL_KINLINE float hsum8_m256(__m256 v) {
  f32x8 u;
  std::memcpy(&u, &v, sizeof(u));
  return hsum8(u);
}

// Whether the k bytes of a weight row hold a NaN (a row marked in row_special: NaN or subnormal bytes).
bool row_has_nan(const uint8_t* row, int64_t k) {
  __m128i nan = _mm_setzero_si128();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) nan = _mm_or_si128(nan, nan_bytes16(row + i));
  for (; i < k; ++i) {
    if ((row[i] & 0x7F) == 0x7F) return true;
  }
  return !_mm_testz_si128(nan, nan);
}

// The 16-weight steps [0, steps) of a block of R weight rows (bytes at src[j]) against x's block xp, into the rows'
// totals; kScan: their NaN bytes into nan[j]. kFull: all kSteps (unrolled).
template <bool kScan, bool kFull, int R>
KEEL_KINLINE void block_m1_avx2(const uint8_t* const* src, const float* xp, const float* scale, int steps,
                                __m256* total, __m128i* nan) {
  if (kFull) steps = kSteps;
  __m256 acc[R];
#pragma GCC unroll 4
  for (int j = 0; j < R; ++j) {
    _mm_prefetch(reinterpret_cast<const char*>(src[j] + kFarPrefetchBytes), _MM_HINT_T2);
    _mm_prefetch(reinterpret_cast<const char*>(src[j] + kFarPrefetchBytes + 64), _MM_HINT_T2);
  }
#pragma GCC unroll 8
  for (int s = 0; s < steps; ++s) {
    const __m256 x0 = ld8(xp + 16 * s);
    const __m256 x1 = ld8(xp + 16 * s + 8);
#pragma GCC unroll 4
    for (int j = 0; j < R; ++j) {
      if (kScan) nan[j] = _mm_or_si128(nan[j], nan_bytes16(src[j] + 16 * s));
      __m256 w0, w1;
      decode16_nonan(src[j] + 16 * s, w0, w1);
      acc[j] = s == 0 ? _mm256_mul_ps(x0, w0) : _mm256_fmadd_ps(x0, w0, acc[j]);
      acc[j] = _mm256_fmadd_ps(x1, w1, acc[j]);
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < R; ++j) total[j] = _mm256_fmadd_ps(acc[j], _mm256_set1_ps(scale[j]), total[j]);
}

// Steps of block b that hold a column < k, and whether its last one is partial (then read from a zero-padded copy).
KEEL_KINLINE int block_steps(const Fp8LinearParams& p, int64_t b) {
  const int64_t left = p.k - b * kFp8BlockK;
  return left >= kFp8BlockK ? kSteps : static_cast<int>((left + 15) / 16);
}

// Decode: weight rows [r0, r0 + R) against the one row of x. A row with a NaN byte gives NaN: kScan finds them here;
// without it, the rows the caller's row_special marks (NaN or subnormal bytes; the decode takes subnormals exactly)
// are scanned after the pass.
template <bool kScan, int R>
void rows_avx2_m1(const Fp8LinearParams& p, int64_t r0) {
  const int64_t nb = p.kp / kFp8BlockK;
  const int64_t full = p.k / kFp8BlockK;
  const uint8_t* row[R];
  const float* srow[R];
  __m256 total[R];
  __m128i nan[R];
#pragma GCC unroll 4
  for (int j = 0; j < R; ++j) {
    row[j] = p.w + (r0 + j) * p.w_row;
    srow[j] = p.scale + ((r0 + j) / p.scale_rows) * p.scale_s0;
    total[j] = _mm256_setzero_ps();
    nan[j] = _mm_setzero_si128();
  }
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* src[R];
    float scale[R];
#pragma GCC unroll 4
    for (int j = 0; j < R; ++j) {
      src[j] = row[j] + b * kFp8BlockK;
      scale[j] = block_scale(p, srow[j], b);
    }
    if (b < full) {
      block_m1_avx2<kScan, true, R>(src, p.x + b * kFp8BlockK, scale, kSteps, total, nan);
      continue;
    }
    const int steps = block_steps(p, b);
    alignas(64) uint8_t pad[R][kFp8BlockK];
    if ((p.k - b * kFp8BlockK) % 16 != 0) {  // a partial last step: the block from zero-padded copies
#pragma GCC unroll 4
      for (int j = 0; j < R; ++j) {
        std::memset(pad[j], 0, kFp8BlockK);
        std::memcpy(pad[j], src[j], static_cast<size_t>(p.k - b * kFp8BlockK));
        src[j] = pad[j];
      }
    }
    block_m1_avx2<kScan, false, R>(src, p.x + b * kFp8BlockK, scale, steps, total, nan);
  }
#pragma GCC unroll 4
  for (int j = 0; j < R; ++j) {
    const bool is_nan = kScan ? !_mm_testz_si128(nan[j], nan[j])
                              : p.row_special[(r0 + j) * p.row_special_stride] != 0 && row_has_nan(row[j], p.k);
    store_any(p, 0, r0 + j, hsum8_m256(total[j]), is_nan);
  }
}

// Prompts (several rows of x). A range of weight rows is decoded once into a buffer (per row: the steps of each block
// that hold a column < k, a partial last step from a zero-padded copy, NaN bytes noted), small enough to stay in L1;
// then tiles of MR rows of x times NR of those weight rows keep their block sums and totals in registers, each
// output in the order above.
constexpr int64_t kAvx2PromptBytes = 16384;  // decoded fp32 weights of one range

struct DecodedRows {
  float* w;       // [rows][kp], row j at w + j * kp
  bool nan[64];   // per row: a NaN byte
  int last_nvec;  // 8-column vectors of the last block that hold a column < k
};

int64_t decode_rows_avx2(const Fp8LinearParams& p, int64_t r0, int64_t rows, DecodedRows& d) {
  const int64_t nb = p.kp / kFp8BlockK;
  alignas(64) uint8_t pad[kFp8BlockK];
  for (int64_t j = 0; j < rows; ++j) {
    const uint8_t* wrow = p.w + (r0 + j) * p.w_row;
    __m128i nan = _mm_setzero_si128();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* src = wrow + b * kFp8BlockK;
      const int64_t left = p.k - b * kFp8BlockK;
      if (left < kFp8BlockK && left % 16 != 0) {
        std::memset(pad, 0, sizeof(pad));
        std::memcpy(pad, src, static_cast<size_t>(left));
        src = pad;
      }
      float* dst = d.w + j * p.kp + b * kFp8BlockK;
      const int steps = block_steps(p, b);
      for (int s = 0; s < steps; ++s) {
        nan = _mm_or_si128(nan, nan_bytes16(src + 16 * s));
        __m256 lo, hi;
        decode16_nonan(src + 16 * s, lo, hi);
        _mm256_storeu_ps(dst + 16 * s, lo);
        _mm256_storeu_ps(dst + 16 * s + 8, hi);
      }
    }
    d.nan[j] = !_mm_testz_si128(nan, nan);
  }
  d.last_nvec = 2 * block_steps(p, nb - 1);
  return nb;
}

// One block of MR x rows times NR decoded weight rows into the tile's totals (kFull: all 16 vectors, unrolled).
template <int MR, int NR, bool kFull>
KEEL_KINLINE void tile_block_avx2(const float* const* wd, const float* const* xr, int64_t o, int nvec,
                                  const float* scale, __m256 (&total)[MR][NR]) {
  if (kFull) nvec = 2 * kSteps;
  __m256 acc[MR][NR];
#pragma GCC unroll 3
  for (int i = 0; i < MR; ++i) {
    const __m256 x = ld8(xr[i] + o);
#pragma GCC unroll 2
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_mul_ps(x, ld8(wd[j] + o));
  }
#pragma GCC unroll 16
  for (int v = 1; v < nvec; ++v) {
    __m256 w[NR];
#pragma GCC unroll 2
    for (int j = 0; j < NR; ++j) w[j] = ld8(wd[j] + o + 8 * v);
#pragma GCC unroll 3
    for (int i = 0; i < MR; ++i) {
      const __m256 x = ld8(xr[i] + o + 8 * v);
#pragma GCC unroll 2
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(x, w[j], acc[i][j]);
    }
  }
#pragma GCC unroll 3
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 2
    for (int j = 0; j < NR; ++j) total[i][j] = _mm256_fmadd_ps(acc[i][j], _mm256_set1_ps(scale[j]), total[i][j]);
  }
}

template <int MR, int NR>
void tile_avx2(const Fp8LinearParams& p, const DecodedRows& d, int64_t nb, int64_t m0, int64_t r0, int64_t j0) {
  const float* wd[NR];
  const float* srow[NR];
  const float* xr[MR];
  __m256 total[MR][NR];
#pragma GCC unroll 2
  for (int j = 0; j < NR; ++j) {
    wd[j] = d.w + (j0 + j) * p.kp;
    srow[j] = p.scale + ((r0 + j0 + j) / p.scale_rows) * p.scale_s0;
  }
#pragma GCC unroll 3
  for (int i = 0; i < MR; ++i) {
    xr[i] = p.x + (m0 + i) * p.kp;
#pragma GCC unroll 2
    for (int j = 0; j < NR; ++j) total[i][j] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    float scale[NR];
#pragma GCC unroll 2
    for (int j = 0; j < NR; ++j) scale[j] = block_scale(p, srow[j], b);
    const int nvec = b + 1 < nb ? 2 * kSteps : d.last_nvec;
    if (nvec == 2 * kSteps) {
      tile_block_avx2<MR, NR, true>(wd, xr, b * kFp8BlockK, nvec, scale, total);
    } else {
      tile_block_avx2<MR, NR, false>(wd, xr, b * kFp8BlockK, nvec, scale, total);
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) store_any(p, m0 + i, r0 + j0 + j, hsum8_m256(total[i][j]), d.nan[j0 + j]);
  }
}

template <int MR>
void tiles_avx2(const Fp8LinearParams& p, const DecodedRows& d, int64_t nb, int64_t m0, int64_t r0, int64_t rows) {
  int64_t j = 0;
  for (; j + 2 <= rows; j += 2) tile_avx2<MR, 2>(p, d, nb, m0, r0, j);
  if (j < rows) tile_avx2<MR, 1>(p, d, nb, m0, r0, j);
}

void cols_avx2_rows(const Fp8LinearParams& p, int64_t begin, int64_t end) {
  thread_local std::vector<float> buf;
  const int64_t range = std::max<int64_t>(1, std::min<int64_t>(64, kAvx2PromptBytes / (p.kp * 4)));
  buf.resize(static_cast<size_t>(range * p.kp));
  DecodedRows d{};
  d.w = buf.data();
  for (int64_t r0 = begin; r0 < end; r0 += range) {
    const int64_t rows = std::min(range, end - r0);
    const int64_t nb = decode_rows_avx2(p, r0, rows, d);
    int64_t m0 = 0;
    for (; m0 + 3 <= p.m; m0 += 3) tiles_avx2<3>(p, d, nb, m0, r0, rows);
    if (p.m - m0 == 2) tiles_avx2<2>(p, d, nb, m0, r0, rows);
    if (p.m - m0 == 1) tiles_avx2<1>(p, d, nb, m0, r0, rows);
  }
}

void cols_avx2(const Fp8LinearParams& p, int64_t begin, int64_t end) {
  if (p.m != 1) return cols_avx2_rows(p, begin, end);
  int64_t r = begin;
  for (; r + kAvx2DecodeRows <= end; r += kAvx2DecodeRows) {
    if (p.row_special != nullptr) {
      rows_avx2_m1<false, kAvx2DecodeRows>(p, r);
    } else {
      rows_avx2_m1<true, kAvx2DecodeRows>(p, r);
    }
  }
  for (; r < end; ++r) rows_avx2_m1<true, 1>(p, r);
}
#endif  // __AVX2__

// ---- AVX-512 ------------------------------------------------------------------------------------------

#if defined(__AVX2__)
#define KEEL_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

using vec::hsum16;
using vec::hsum16x4;

// 32 e4m3 bytes -> two vectors of value * 2^-8
KEEL_AVX512 KEEL_KINLINE void decode32(__m256i raw, __m512* w) {
  const __m512i h =
      _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(raw), 7), _mm512_set1_epi16(static_cast<short>(0xBF80)));
  w[0] = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
  w[1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}

// One 128-byte block of a weight row -> 8 vectors; masked past `left` bytes (zeros, and no read past the
// row). Sets bits of `nan` for NaN bytes.
KEEL_AVX512 KEEL_KINLINE void decode_block(const uint8_t* src, int64_t left, __m512* w, __mmask64& nan) {
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i ones = _mm512_set1_epi8(-1);
  if (left >= kFp8BlockK) {
    _mm_prefetch(reinterpret_cast<const char*>(src + kPrefetchBytes), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(src + kPrefetchBytes + 64), _MM_HINT_T0);
    nan |= _mm512_cmpeq_epi8_mask(_mm512_or_si512(_mm512_loadu_si512(src), sign), ones);
    nan |= _mm512_cmpeq_epi8_mask(_mm512_or_si512(_mm512_loadu_si512(src + 64), sign), ones);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) decode32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32 * j)), w + 2 * j);
    return;
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const int64_t n = left - 32 * j;
    const __mmask32 m = n >= 32 ? ~__mmask32{0} : n <= 0 ? __mmask32{0} : (__mmask32{1} << n) - 1;
    const __m256i raw = _mm256_maskz_loadu_epi8(m, src + 32 * j);
    nan |= _mm512_cmpeq_epi8_mask(_mm512_or_si512(_mm512_castsi256_si512(raw), sign), ones) & 0xFFFFFFFFull;
    decode32(raw, w + 2 * j);
  }
}

KEEL_AVX512 KEEL_KINLINE __m512 block_dot(const float* xp, const __m512* w) {
  __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(xp), w[0]);
#pragma GCC unroll 8
  for (int j = 1; j < 8; ++j) acc = _mm512_fmadd_ps(_mm512_loadu_ps(xp + 16 * j), w[j], acc);
  return acc;
}

KEEL_AVX512 void cols_avx512(const Fp8LinearParams& p, int64_t begin, int64_t end) {
  const int64_t nb = p.kp / kFp8BlockK;
  if (p.m == 1) {  // decode: the running total stays in a register
    for (int64_t r = begin; r < end; ++r) {
      const uint8_t* wrow = p.w + r * p.w_row;
      const float* srow = p.scale + (r / p.scale_rows) * p.scale_s0;
      __mmask64 nan = 0;
      __m512 total = _mm512_setzero_ps();
      for (int64_t b = 0; b < nb; ++b) {
        __m512 w[8];
        decode_block(wrow + b * kFp8BlockK, p.k - b * kFp8BlockK, w, nan);
        const __m512 acc = block_dot(p.x + b * kFp8BlockK, w);
        total = _mm512_fmadd_ps(acc, _mm512_set1_ps(block_scale(p, srow, b)), total);
      }
      store_any(p, 0, r, hsum16(total), nan != 0);
    }
    return;
  }
  __m512 total[kFp8RowBlock];
  for (int64_t r = begin; r < end; ++r) {
    const uint8_t* wrow = p.w + r * p.w_row;
    const float* srow = p.scale + (r / p.scale_rows) * p.scale_s0;
    __mmask64 nan = 0;
    for (int64_t i = 0; i < p.m; ++i) total[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      __m512 w[8];
      decode_block(wrow + b * kFp8BlockK, p.k - b * kFp8BlockK, w, nan);
      const __m512 s = _mm512_set1_ps(block_scale(p, srow, b));
      for (int64_t i = 0; i < p.m; ++i) {
        total[i] = _mm512_fmadd_ps(block_dot(p.x + i * p.kp + b * kFp8BlockK, w), s, total[i]);
      }
    }
    for (int64_t i = 0; i < p.m; ++i) store_any(p, i, r, hsum16(total[i]), nan != 0);
  }
}

// ---- AVX512-BF16: e4m3 as bf16, vdpbf16ps ----------------------------------------------------------------
// Sign-extending an e4m3 byte to 16 bits, shifting it left by 4 and keeping bits 15 and 10..4 gives the bf16
// number with the same sign, exponent field and mantissa, i.e. the value times 2^-120 (3 ops per 32
// weights); vdpbf16ps then does 32 multiply-adds per instruction (products exact, fp32 sums) against x's
// bf16 copy scaled by 2^e (p.x16), which keeps the products far from fp32's subnormals. e4m3 subnormals
// would become bf16 subnormals, which vdpbf16ps reads as zero, and NaN bytes would become finite numbers:
// a block holding either goes through the exact fp16 decode instead. Zero bytes (+-0) decode to bf16 +-0 and
// stay on the bf16 path: with u = ((b + 1) & 0x7F), a byte is special when u <= 8 and u != 1 (u = 0: NaN,
// 2..8: subnormal, 1: zero). Per block: acc = dpbf16 over the 4 32-wide pieces in order, total += acc * s.
#define KEEL_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

template <bool kFull>
KEEL_AVX512BF16 KEEL_KINLINE __mmask32 piece_mask(int64_t left, int j) {
  if (kFull) return ~__mmask32{0};
  const int64_t n = left - 32 * j;
  return n >= 32 ? ~__mmask32{0} : n <= 0 ? __mmask32{0} : (__mmask32{1} << n) - 1;
}

// Bytes of `raw` (among `m`) that the bf16 decode cannot take: subnormal or NaN (zeros are fine), see above.
KEEL_AVX512BF16 KEEL_KINLINE __mmask64 special_bytes(__mmask64 m, __m512i raw) {
  const __m512i one = _mm512_set1_epi8(1);
  const __m512i u = _mm512_and_si512(_mm512_add_epi8(raw, one), _mm512_set1_epi8(0x7F));
  return _mm512_mask_cmple_epu8_mask(m & _mm512_cmpneq_epi8_mask(u, one), u, _mm512_set1_epi8(8));
}

// 128 bytes of a weight row -> 4 bf16 vectors (masked past `left`); returns false when a byte needs the
// exact path (subnormal or NaN)
template <bool kFull>
KEEL_AVX512BF16 KEEL_KINLINE bool decode_block_bf16(const uint8_t* src, int64_t left, __m512bh* w) {
  const __m512i keep = _mm512_set1_epi16(static_cast<short>(0x87F0));
  __mmask64 special = 0;
  if (kFull) {
    _mm_prefetch(reinterpret_cast<const char*>(src + kFarPrefetchBytes), _MM_HINT_T2);
    _mm_prefetch(reinterpret_cast<const char*>(src + kFarPrefetchBytes + 64), _MM_HINT_T2);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {  // the test on 64 bytes at a time, the decode on 32
      special |= special_bytes(~__mmask64{0}, _mm512_loadu_si512(src + 64 * h));
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32 * j));
      w[j] = (__m512bh)_mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(raw), 4), keep);
    }
    return special == 0;
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __mmask32 m = piece_mask<kFull>(left, j);
    const __m256i raw = _mm256_maskz_loadu_epi8(m, src + 32 * j);
    special |= special_bytes(m, _mm512_castsi256_si512(raw));
    w[j] = (__m512bh)_mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(raw), 4), keep);
  }
  return special == 0;
}

KEEL_AVX512BF16 KEEL_KINLINE __m512 block_dot_bf16(const uint16_t* xp, const __m512bh* w) {
  __m512 acc = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)_mm512_loadu_si512(xp), w[0]);
#pragma GCC unroll 4
  for (int j = 1; j < 4; ++j) acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(xp + 32 * j), w[j]);
  return acc;
}

// One block of weight row r for rows [0, m) of x: adds to total[i] in units of 2^(e_i - 120) (a row without
// the bf16 copy, x16_ok[i] == 0: in units of 1, always through the exact decode). kMixed: some rows of the
// pass lack the bf16 copy (rare: the per-row test sits outside the common path's loop).
template <bool kFull, bool kMixed>
KEEL_AVX512BF16 KEEL_KINLINE void block_bf16(const Fp8LinearParams& p, const uint8_t* src, int64_t b, float s,
                                             __m512* total, __mmask64& nan) {
  const int64_t left = p.k - b * kFp8BlockK;
  __m512bh w[4];
  const bool fast = decode_block_bf16<kFull>(src, left, w);
  if (fast) {
    const __m512 sv = _mm512_set1_ps(s);
    for (int64_t i = 0; i < p.m; ++i) {
      if (kMixed && !p.x16_ok[i]) continue;
      total[i] = _mm512_fmadd_ps(block_dot_bf16(p.x16 + i * p.kp + b * kFp8BlockK, w), sv, total[i]);
    }
    if (!kMixed) return;
  }
  __m512 wf[8];  // exact: fp16 decode, fp32 FMA against x
  decode_block(src, left, wf, nan);
  for (int64_t i = 0; i < p.m; ++i) {
    if (kMixed && fast && p.x16_ok[i]) continue;
    const __m512 acc = block_dot(p.x + i * p.kp + b * kFp8BlockK, wf);
    total[i] = _mm512_fmadd_ps(acc, _mm512_set1_ps(s * p.x_scale[i]), total[i]);
  }
}

template <int64_t M, bool kMixed>  // M > 0: exactly M rows of x (totals in registers); 0: p.m rows
KEEL_AVX512BF16 void cols_bf16_rows(const Fp8LinearParams& p, int64_t begin, int64_t end) {
  const int64_t nb = p.kp / kFp8BlockK;
  const int64_t full = p.k / kFp8BlockK;
  Fp8LinearParams q = p;
  if (M > 0) q.m = M;
  __m512 total[M > 0 ? M : kFp8RowBlock];
  for (int64_t r = begin; r < end; ++r) {
    const uint8_t* wrow = q.w + r * q.w_row;
    const float* srow = q.scale + (r / q.scale_rows) * q.scale_s0;
    __mmask64 nan = 0;
    for (int64_t i = 0; i < q.m; ++i) total[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < full; ++b) {
      block_bf16<true, kMixed>(q, wrow + b * kFp8BlockK, b, srow[b * q.scale_s1], total, nan);
    }
    if (full < nb) block_bf16<false, kMixed>(q, wrow + full * kFp8BlockK, full, srow[full * q.scale_s1], total, nan);
    for (int64_t i = 0; i < q.m; ++i) store_any(q, i, r, hsum16(total[i]) * q.x16_unscale[i], nan != 0);
  }
}

// Many rows of x, every one with its bf16 copy: two weight rows per pass, so each x piece loaded feeds two dot
// products. Per output the same sums in the same order as cols_bf16_rows (a block's four pieces from zero, then
// total += acc * s, hsum16 at the end), so the same bits; a weight row with a block that needs the exact decode
// (subnormal or NaN bytes) is computed again by cols_bf16_rows, whose result it then is.
template <bool kFull>
KEEL_AVX512BF16 KEEL_KINLINE void pair_block_bf16(const Fp8LinearParams& p, const uint8_t* src0, const uint8_t* src1,
                                                  int64_t b, float s0, float s1, __m512* total, bool& ok0, bool& ok1) {
  const int64_t left = p.k - b * kFp8BlockK;
  __m512bh w0[4];
  __m512bh w1[4];
  ok0 &= decode_block_bf16<kFull>(src0, left, w0);
  ok1 &= decode_block_bf16<kFull>(src1, left, w1);
  const __m512 sv0 = _mm512_set1_ps(s0);
  const __m512 sv1 = _mm512_set1_ps(s1);
  for (int64_t i = 0; i < p.m; ++i) {
    const uint16_t* xp = p.x16 + i * p.kp + b * kFp8BlockK;
    __m512 a0 = _mm512_setzero_ps();
    __m512 a1 = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(xp + 32 * j);
      a0 = _mm512_dpbf16_ps(a0, xv, w0[j]);
      a1 = _mm512_dpbf16_ps(a1, xv, w1[j]);
    }
    total[2 * i] = _mm512_fmadd_ps(a0, sv0, total[2 * i]);
    total[2 * i + 1] = _mm512_fmadd_ps(a1, sv1, total[2 * i + 1]);
  }
}

KEEL_AVX512BF16 void rows_bf16_pair(const Fp8LinearParams& p, int64_t r0) {
  const int64_t nb = p.kp / kFp8BlockK;
  const int64_t full = p.k / kFp8BlockK;
  const uint8_t* w0 = p.w + r0 * p.w_row;
  const uint8_t* w1 = w0 + p.w_row;
  const float* s0 = p.scale + (r0 / p.scale_rows) * p.scale_s0;
  const float* s1 = p.scale + ((r0 + 1) / p.scale_rows) * p.scale_s0;
  __m512 total[2 * kFp8RowBlock];
  for (int64_t i = 0; i < 2 * p.m; ++i) total[i] = _mm512_setzero_ps();
  bool ok[2] = {true, true};
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t o = b * kFp8BlockK;
    const float sa = s0[b * p.scale_s1];
    const float sb = s1[b * p.scale_s1];
    if (b < full) {
      pair_block_bf16<true>(p, w0 + o, w1 + o, b, sa, sb, total, ok[0], ok[1]);
    } else {
      pair_block_bf16<false>(p, w0 + o, w1 + o, b, sa, sb, total, ok[0], ok[1]);
    }
  }
  for (int j = 0; j < 2; ++j) {
    if (!ok[j]) {
      cols_bf16_rows<0, false>(p, r0 + j, r0 + j + 1);
      continue;
    }
    for (int64_t i = 0; i < p.m; ++i) store_any(p, i, r0 + j, hsum16(total[2 * i + j]) * p.x16_unscale[i], false);
  }
}

// from this many rows of x the pairs (below, no faster: docs/measurements/2026-12-03-prefetch.md)
constexpr int64_t kPairMinRows = 16;

template <int64_t M>
KEEL_AVX512BF16 void cols_bf16_impl(const Fp8LinearParams& p, int64_t begin, int64_t end) {
  const int64_t m = M > 0 ? M : p.m;
  for (int64_t i = 0; i < m; ++i) {
    if (!p.x16_ok[i]) return cols_bf16_rows<M, true>(p, begin, end);
  }
  if (M == 0 && m >= kPairMinRows) {
    int64_t r = begin;
    for (; r + 2 <= end; r += 2) rows_bf16_pair(p, r);
    return cols_bf16_rows<M, false>(p, r, end);
  }
  cols_bf16_rows<M, false>(p, begin, end);
}

// Decode (one row of x): kRows weight rows per pass. Each x piece is loaded once for all of them, the kRows
// dot-product chains are independent, and a cheap test for bytes the bf16 decode may not take runs over whole
// rows on the side (per 64 bytes: u = ((b + 1) & 0x7F), kept as a running minimum; u <= 8 marks a zero,
// subnormal or NaN byte). A row it marks (a few % of real rows hold a zero byte) is scanned again for the
// subnormal or NaN bytes of block_bf16's test among its k bytes (zeros are fine), and only a row that holds
// one is computed again by cols_bf16_impl<1> (computing every marked row again is much slower on SmolLM2-shaped
// weights: docs/measurements/2026-12-02-decode-step.md). So every row's result
// is exactly that function's: the same per-block sums in the same order, the same 16-lane tree (three hadds
// give hsum8's (v0+v4)+(v1+v5) + (v2+v6)+(v3+v7) for four rows at once). The tail block is read unmasked (x
// is zero past k, and bytes past k are finite once decoded, so they add zeros, and the second scan stops at
// k), which needs kp bytes readable from every row of the group: the caller checks it. With the caller's
// row_special (its fp8_special_rows of the weight, computed once at load) the side test is skipped (kScan
// false): a row it marks goes to the exact pass directly, the others keep the fast pass's sums (same bits).
constexpr int kDecodeRows = 4;

// Whether the k bytes at `src` hold a byte block_bf16 sends to the exact decode (subnormal or NaN).
KEEL_AVX512BF16 bool row_has_special(const uint8_t* src, int64_t k) {
  for (int64_t i = 0; i < k; i += 64) {
    const int64_t n = k - i;
    const __mmask64 m = n >= 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1;
    if (special_bytes(m, _mm512_maskz_loadu_epi8(m, src + i)) != 0) return true;
  }
  return false;
}

template <bool kScan>
KEEL_AVX512BF16 void rows_bf16_m1(const Fp8LinearParams& p, int64_t r0) {
  constexpr int R = kDecodeRows;
  const int64_t nb = p.kp / kFp8BlockK;
  const __m512i one = _mm512_set1_epi8(1);
  const __m512i low7 = _mm512_set1_epi8(0x7F);
  const __m512i keep = _mm512_set1_epi16(static_cast<short>(0x87F0));
  const uint8_t* w0 = p.w + r0 * p.w_row;
  const float* s0 = p.scale + (r0 / p.scale_rows) * p.scale_s0;
  const int64_t srow[R] = {0, ((r0 + 1) / p.scale_rows - r0 / p.scale_rows) * p.scale_s0,
                           ((r0 + 2) / p.scale_rows - r0 / p.scale_rows) * p.scale_s0,
                           ((r0 + 3) / p.scale_rows - r0 / p.scale_rows) * p.scale_s0};
  __m512 total[R];
  __m512i low[R];
#pragma GCC unroll 4
  for (int j = 0; j < R; ++j) {
    total[j] = _mm512_setzero_ps();
    low[j] = _mm512_set1_epi8(-1);
  }
  for (int64_t b = 0; b < nb; ++b) {
    const uint16_t* xp = p.x16 + b * kFp8BlockK;
    __m512bh xv[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) xv[i] = (__m512bh)_mm512_loadu_si512(xp + 32 * i);
#pragma GCC unroll 4
    for (int j = 0; j < R; ++j) {
      const uint8_t* src = w0 + j * p.w_row + b * kFp8BlockK;
      _mm_prefetch(reinterpret_cast<const char*>(src + kPrefetchBytes), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(src + kPrefetchBytes + 64), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(src + kFarPrefetchBytes), _MM_HINT_T2);
      _mm_prefetch(reinterpret_cast<const char*>(src + kFarPrefetchBytes + 64), _MM_HINT_T2);
      if (kScan) {
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          const __m512i raw = _mm512_loadu_si512(src + 64 * h);
          low[j] = _mm512_min_epu8(low[j], _mm512_and_si512(_mm512_add_epi8(raw, one), low7));
        }
      }
      __m512 acc = _mm512_setzero_ps();
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32 * i));
        const __m512bh wv = (__m512bh)_mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(raw), 4), keep);
        acc = _mm512_dpbf16_ps(acc, xv[i], wv);
      }
      total[j] = _mm512_fmadd_ps(acc, _mm512_set1_ps(s0[srow[j] + b * p.scale_s1]), total[j]);
    }
  }
  alignas(16) float sums[R];
  _mm_store_ps(sums, _mm_mul_ps(hsum16x4(total[0], total[1], total[2], total[3]), _mm_set1_ps(p.x16_unscale[0])));
  const __m512i eight = _mm512_set1_epi8(8);
#pragma GCC unroll 4
  for (int j = 0; j < R; ++j) {
    // a zero, subnormal or NaN byte somewhere in the row (or past k in its tail block): a subnormal or NaN
    // byte among its k bytes sends it to the exact pass
    const bool special = kScan ? _mm512_cmple_epu8_mask(low[j], eight) != 0 && row_has_special(w0 + j * p.w_row, p.k)
                               : p.row_special[(r0 + j) * p.row_special_stride] != 0;
    if (special) {
      cols_bf16_impl<1>(p, r0 + j, r0 + j + 1);
    } else {
      store_any(p, 0, r0 + j, sums[j], false);
    }
  }
}

KEEL_AVX512BF16 void cols_bf16(const Fp8LinearParams& p, int64_t begin, int64_t end) {
  if (p.m != 1) return cols_bf16_impl<0>(p, begin, end);
  // groups of rows whose unmasked tail reads stay inside the weight: row r reads [r * w_row, r * w_row + kp)
  const int64_t last_byte = (p.n - 1) * p.w_row + p.k;
  int64_t r = begin;
  for (; r + kDecodeRows <= end && (r + kDecodeRows - 1) * p.w_row + p.kp <= last_byte; r += kDecodeRows) {
    if (p.row_special != nullptr) {
      rows_bf16_m1<false>(p, r);
    } else {
      rows_bf16_m1<true>(p, r);
    }
  }
  if (r < end) cols_bf16_impl<1>(p, r, end);
}
#endif  // __AVX2__

}  // namespace

void fp8_linear_cols(const Fp8LinearParams& p, int64_t begin, int64_t end) {
#if defined(__AVX2__)
  if (p.x16 != nullptr) return cols_bf16(p, begin, end);  // the wrapper chose AVX512-BF16
  if (cpu_has_avx512()) return cols_avx512(p, begin, end);
  return cols_avx2(p, begin, end);
#endif
  cols_portable(p, begin, end);
}

}  // namespace keel::KEEL_CPU_NS
