// keel/csrc/ops/fp8_linear_amx.cpp
// AMX prompt GEMM of keel::fp8_linear for bf16 x (compiled once per ISA, no torch header; the code exists
// only in the AVX2 build and runs only when keel::cpu_has_amx()).
//
// Per block of 32 weight rows and each 128-wide K block: the e4m3 bytes are decoded ONCE into a bf16 panel
// [32][128] (8 KB, in L1) and that panel is the A operand of tdpbf16ps for every row of x (x packed once per
// call into the B-tile layout, as keel::linear's AMX path does). The decode is exact: every e4m3 value is a
// bf16 number (sign, exponent + 120, the 3 mantissa bits; the 7 subnormals m * 2^-9 from a table, all bf16
// normals; +-0 stays +-0; the NaN bytes S.1111.111 become a quiet NaN, which makes every output of that
// weight row NaN through the arithmetic, as the GEMV path does). bf16 x is used as is (exact); fp32 and fp16
// x never come here (the wrapper keeps them on the GEMV path).
//
// Summation order (defines the result): per output and per K block b, an fp32 tile accumulator starts at +0
// and takes the block's 4 32-wide steps in order (tdpbf16ps: exact bf16 products added pair by pair, round to
// nearest even, subnormal inputs read as zero and subnormal results flushed, as vdpbf16ps); then
// total = fma(block sum, scale[n, b], total) in fp32, blocks in order from total = +0; at the end the bias
// (when given) is added and the sum rounded once to bf16, to nearest even. K past k is zero on both sides.
// The same for every output whatever its block, thread or chunk: results never depend on the thread count
// or how N and M are split (they do depend on the ISA: the AVX-512 GEMV sums lanes in a tree).
#include <vector>

#include "ops/amx_common.h"
#include "ops/fp8_linear_amx.h"

namespace keel::KEEL_CPU_NS {
#if defined(__AVX2__)
namespace {

// bf16 bits of the e4m3 subnormals m * 2^-9, m = 0..7 (index m; the rest unused)
alignas(64) const uint16_t kSubnormalBf16[32] = {0x0000, 0x3B00, 0x3B80, 0x3BC0, 0x3C00, 0x3C20, 0x3C40, 0x3C60};

// 32 e4m3 bytes -> 32 bf16 (exact; NaN bytes -> quiet NaN)
KEEL_AMX KEEL_KINLINE __m512i decode32(__m256i raw, __m512i lut) {
  const __m512i v = _mm512_cvtepu8_epi16(raw);
  const __m512i sign = _mm512_slli_epi16(_mm512_and_si512(v, _mm512_set1_epi16(0x80)), 8);
  const __m512i mag = _mm512_and_si512(v, _mm512_set1_epi16(0x7F));
  __m512i r = _mm512_add_epi16(_mm512_slli_epi16(mag, 4), _mm512_set1_epi16(0x3C00));  // normals
  r = _mm512_mask_blend_epi16(_mm512_cmplt_epu16_mask(mag, _mm512_set1_epi16(8)), r,
                              _mm512_permutexvar_epi16(mag, lut));
  r = _mm512_mask_blend_epi16(_mm512_cmpeq_epi16_mask(mag, _mm512_set1_epi16(0x7F)), r, _mm512_set1_epi16(0x7FC0));
  return _mm512_or_si512(r, sign);
}

// Rows [n0, n0 + nv) and K block b of the weight -> panel[32][128] bf16, zeros past nv rows and past k.
KEEL_AMX void decode_panel(const Fp8AmxParams& p, int64_t n0, int64_t nv, int64_t b, uint16_t* panel) {
  const __m512i lut = _mm512_load_si512(kSubnormalBf16);
  const int64_t left = p.k - b * kFp8BlockK;
  for (int64_t r = 0; r < kFp8AmxBlockN; ++r) {
    uint16_t* dst = panel + r * kFp8BlockK;
    if (r >= nv) {
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) _mm512_store_si512(dst + 32 * j, _mm512_setzero_si512());
      continue;
    }
    const uint8_t* src = p.w + (n0 + r) * p.w_row + b * kFp8BlockK;
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const int64_t n = left - 32 * j;
      __m256i raw;
      if (n >= 32) {
        raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32 * j));
      } else {
        const __mmask32 m = n <= 0 ? __mmask32{0} : (__mmask32{1} << n) - 1;
        raw = _mm256_maskz_loadu_epi8(m, src + 32 * j);
      }
      _mm512_store_si512(dst + 32 * j, decode32(raw, lut));
    }
  }
}

}  // namespace

KEEL_AMX void fp8_linear_amx_pack(const Fp8AmxParams& p, int64_t begin, int64_t end) {
  amx::pack_x(p.x, p.x_row, p.m, p.k, p.kp, p.xpack, begin, end);
}

KEEL_AMX void fp8_linear_amx_cols(const Fp8AmxParams& p, int64_t begin, int64_t end) {
  const int64_t nb = p.kp / kFp8BlockK;
  const int64_t group = (p.kp / 2) * 32;  // elements of one 16-row group of xpack
  const int64_t mp = p.mp;
  thread_local std::vector<float> total;  // [32 weight rows][mp x rows]
  alignas(64) uint16_t panel[kFp8AmxBlockN * kFp8BlockK];
  alignas(64) float cbuf[4][16][16];
  alignas(64) float bias32[kFp8AmxBlockN];
  float s[kFp8AmxBlockN];
  total.resize(static_cast<size_t>(kFp8AmxBlockN * mp));
  amx::configure();
  for (int64_t blk = begin; blk < end; ++blk) {
    const int64_t n0 = blk * kFp8AmxBlockN;
    const int64_t nv = p.n - n0 < kFp8AmxBlockN ? p.n - n0 : kFp8AmxBlockN;
    std::fill(total.begin(), total.end(), 0.0f);
    for (int64_t b = 0; b < nb; ++b) {
      decode_panel(p, n0, nv, b, panel);
      for (int64_t r = 0; r < kFp8AmxBlockN; ++r) {
        s[r] = r < nv ? p.scale[((n0 + r) / p.scale_rows) * p.scale_s0 + b * p.scale_s1] : 0.0f;
      }
      for (int64_t m0 = 0; m0 < mp; m0 += kFp8AmxBlockM) {
        const uint16_t* b0 = p.xpack + (m0 / 16) * group + b * kFp8BlockK * 16;
        const uint16_t* b1 = b0 + group;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          _tile_loadd(4, panel + 32 * j, kFp8BlockK * 2);
          _tile_loadd(5, panel + 16 * kFp8BlockK + 32 * j, kFp8BlockK * 2);
          _tile_loadd(6, b0 + 32 * j * 16, 64);
          _tile_loadd(7, b1 + 32 * j * 16, 64);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, cbuf[0], 64);
        _tile_stored(1, cbuf[1], 64);
        _tile_stored(2, cbuf[2], 64);
        _tile_stored(3, cbuf[3], 64);
        for (int h = 0; h < 2; ++h) {
          for (int r = 0; r < 16; ++r) {
            const __m512 sv = _mm512_set1_ps(s[16 * h + r]);
            float* t = total.data() + (16 * h + r) * mp + m0;
            _mm512_storeu_ps(t, _mm512_fmadd_ps(_mm512_load_ps(cbuf[2 * h][r]), sv, _mm512_loadu_ps(t)));
            _mm512_storeu_ps(t + 16, _mm512_fmadd_ps(_mm512_load_ps(cbuf[2 * h + 1][r]), sv, _mm512_loadu_ps(t + 16)));
          }
        }
      }
    }
    // total [n][m] -> out [m][n]: bias, one rounding
    for (int64_t j = 0; j < kFp8AmxBlockN; ++j) {
      bias32[j] = p.bias && j < nv ? load(p.bias + (n0 + j) * p.bias_stride) : 0.0f;
    }
    for (int h = 0; h < 2; ++h) {
      const int64_t nn = n0 + 16 * h;
      const int64_t nh = p.n - nn;
      if (nh <= 0) break;
      const __mmask16 nmask = nh >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << nh) - 1);
      const __m512 bv = _mm512_loadu_ps(bias32 + 16 * h);
      for (int64_t mm = 0; mm < p.m; mm += 16) {
        __m512i r[16], c[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(total.data() + (16 * h + i) * mp + mm);
        amx::transpose16(r, c);
        const int64_t mv = p.m - mm < 16 ? p.m - mm : 16;
        for (int64_t j = 0; j < mv; ++j) {
          __m512 v = _mm512_castsi512_ps(c[j]);
          if (p.bias) v = _mm512_add_ps(v, bv);
          _mm256_mask_storeu_epi16(p.out + (mm + j) * p.n + nn, nmask, amx::round_bf16(v));
        }
      }
    }
  }
  amx::release();
}
#endif  // __AVX2__
}  // namespace keel::KEEL_CPU_NS
