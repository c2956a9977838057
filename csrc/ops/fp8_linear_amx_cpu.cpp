// keel/csrc/ops/fp8_linear_amx_cpu.cpp
// AMX prompt GEMM of keel::fp8_linear for bf16 x (compiled once per ISA, no torch header; the code exists
// only in the AVX2 build and runs only when keel::cpu_has_amx()).
//
// Per block of 32 weight rows: the e4m3 bytes of all of K are decoded ONCE into a bf16 panel [32][kp] and that
// panel is the A operand of tdpbf16ps for every row of x (x packed once per call into the B-tile layout, as
// keel::linear's AMX path does); per 32 x rows the scaled totals of the block stay in a 4 KB buffer (L1). The decode is
// exact: every e4m3 value is a bf16 number (sign, exponent + 120, the 3 mantissa bits; the 7 subnormals m * 2^-9 from a
// table, all bf16 normals; +-0 stays +-0; the NaN bytes S.1111.111 become a quiet NaN, which makes every output of that
// weight row NaN through the arithmetic, as the GEMV path does). bf16 x is used as is (exact); fp32 and fp16
// x never come here (the wrapper keeps them on the GEMV path).
//
// Summation order (defines the result): per output and per K block b, an fp32 tile accumulator starts at +0
// and takes the block's 4 32-wide steps in order (tdpbf16ps: exact bf16 products added pair by pair, round to
// nearest even, subnormal inputs read as zero and subnormal results flushed, as vdpbf16ps); then
// total = block sum * scale[n, 0] for the first block and total = fma(block sum, scale[n, b], total) for the
// next ones, in order, in fp32; at the end the bias
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

// 32 e4m3 bytes -> 32 bf16, exact. Normal bytes: sign-extend to 16 bits, shift left by 4 and keep bits 15 and
// 10..4 (sign, exponent, mantissa in bf16's places), then add 120 to the exponent field. A piece holding a
// zero, subnormal or NaN byte (one test: (b & 0x7F) + 1 <= 8 after a byte add, which wraps 0x7F to 0x80)
// takes the table decode instead.
KEEL_AMX KEEL_KINLINE __m512i decode32(__m256i raw, __m512i lut) {
  const __mmask32 special = _mm256_cmple_epu8_mask(
      _mm256_and_si256(_mm256_add_epi8(raw, _mm256_set1_epi8(1)), _mm256_set1_epi8(0x7F)), _mm256_set1_epi8(8));
  const __m512i fast = _mm512_add_epi16(
      _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(raw), 4), _mm512_set1_epi16(static_cast<short>(0x87F0))),
      _mm512_set1_epi16(0x3C00));
  if (special == 0) return fast;
  const __m512i v = _mm512_cvtepu8_epi16(raw);
  const __m512i sign = _mm512_slli_epi16(_mm512_and_si512(v, _mm512_set1_epi16(0x80)), 8);
  const __m512i mag = _mm512_and_si512(v, _mm512_set1_epi16(0x7F));
  __m512i r = _mm512_mask_blend_epi16(_mm512_cmplt_epu16_mask(mag, _mm512_set1_epi16(8)), fast,
                                      _mm512_or_si512(_mm512_permutexvar_epi16(mag, lut), sign));
  return _mm512_mask_blend_epi16(_mm512_cmpeq_epi16_mask(mag, _mm512_set1_epi16(0x7F)), r,
                                 _mm512_or_si512(_mm512_set1_epi16(0x7FC0), sign));
}

// Rows [n0, n0 + nv) of the weight, all of K -> panel[32][kp] bf16, zeros past nv rows and past k.
KEEL_AMX void decode_panel(const Fp8AmxParams& p, int64_t n0, int64_t nv, uint16_t* panel) {
  const __m512i lut = _mm512_load_si512(kSubnormalBf16);
  for (int64_t r = 0; r < kFp8AmxBlockN; ++r) {
    uint16_t* dst = panel + r * p.kp;
    if (r >= nv) {
      for (int64_t i = 0; i < p.kp; i += 32) _mm512_storeu_si512(dst + i, _mm512_setzero_si512());
      continue;
    }
    const uint8_t* src = p.w + (n0 + r) * p.w_row;
    int64_t i = 0;
    for (; i + 32 <= p.k; i += 32) {
      _mm512_storeu_si512(dst + i, decode32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)), lut));
    }
    for (; i < p.kp; i += 32) {  // the partial piece (masked: no read past the row), then zeros
      const int64_t left = p.k - i;
      const __mmask32 m = left >= 32 ? ~__mmask32{0} : left <= 0 ? __mmask32{0} : (__mmask32{1} << left) - 1;
      _mm512_storeu_si512(dst + i, decode32(_mm256_maskz_loadu_epi8(m, src + i), lut));
    }
  }
}

}  // namespace

KEEL_AMX void fp8_linear_amx_pack(const Fp8AmxParams& p, int64_t begin, int64_t end) {
  amx::pack_x(p.x, p.x_row, p.m, p.k, p.kp, p.xpack, begin, end);
}

KEEL_AMX void fp8_linear_amx_cols(const Fp8AmxParams& p, int64_t begin, int64_t end) {
  const int64_t nb = p.kp / kFp8BlockK;
  const int64_t group = (p.kp / 2) * 32;     // elements of one 16-row group of xpack
  thread_local std::vector<uint16_t> panel;  // [32][kp]: the decoded weight rows of one block
  thread_local std::vector<float> scales;    // [nb][32]
  panel.resize(static_cast<size_t>(kFp8AmxBlockN * p.kp));
  scales.resize(static_cast<size_t>(kFp8AmxBlockN * nb));
  alignas(64) float cbuf[3][4][16][16];  // three K blocks' tile sums (written by AMX, read by AVX-512)
  alignas(64) float total[4][16][16];    // the scaled running totals of one 32 x 32 block
  alignas(64) float bias32[kFp8AmxBlockN];
  const int64_t pk = p.kp;
  amx::configure();
  for (int64_t blk = begin; blk < end; ++blk) {
    const int64_t n0 = blk * kFp8AmxBlockN;
    const int64_t nv = p.n - n0 < kFp8AmxBlockN ? p.n - n0 : kFp8AmxBlockN;
    decode_panel(p, n0, nv, panel.data());
    for (int64_t r = 0; r < kFp8AmxBlockN; ++r) {
      const float* srow = p.scale + (p.scale_rows == 1 ? n0 + r : (n0 + r) / p.scale_rows) * p.scale_s0;
      for (int64_t b = 0; b < nb; ++b) scales[b * kFp8AmxBlockN + r] = r < nv ? srow[b * p.scale_s1] : 0.0f;
    }
    for (int64_t j = 0; j < kFp8AmxBlockN; ++j) {
      bias32[j] = p.bias && j < nv ? load(p.bias + (n0 + j) * p.bias_stride) : 0.0f;
    }
    const uint16_t* a0 = panel.data();
    const uint16_t* a1 = a0 + 16 * pk;
    for (int64_t m0 = 0; m0 < p.mp; m0 += kFp8AmxBlockM) {
      const uint16_t* b0 = p.xpack + (m0 / 16) * group;
      const uint16_t* b1 = b0 + group;
      // block b's tile products run while the vector units scale and add block b - 2's (cbuf[(b - 2) % 3]: two
      // blocks back, so its tile stores have long landed when the vector loads read them)
      for (int64_t b = 0; b <= nb + 1; ++b) {
        if (b < nb) {
          _tile_zero(0);
          _tile_zero(1);
          _tile_zero(2);
          _tile_zero(3);
#pragma GCC unroll 4
          for (int j = 0; j < 4; ++j) {
            const int64_t k0 = b * kFp8BlockK + 32 * j;
            _tile_loadd(4, a0 + k0, pk * 2);
            _tile_loadd(5, a1 + k0, pk * 2);
            _tile_loadd(6, b0 + k0 * 16, 64);
            _tile_loadd(7, b1 + k0 * 16, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
          }
        }
        if (b > 1) {
          const int64_t pb = b - 2;
          const float (*c)[16][16] = cbuf[pb % 3];
          const float* s = scales.data() + pb * kFp8AmxBlockN;
          for (int t = 0; t < 4; ++t) {  // tile t = n-half * 2 + m-half
            const float* st = s + 16 * (t >> 1);
#pragma GCC unroll 16
            for (int r = 0; r < 16; ++r) {
              const __m512 cv = _mm512_load_ps(c[t][r]);
              const __m512 sv = _mm512_set1_ps(st[r]);
              _mm512_store_ps(total[t][r],
                              pb == 0 ? _mm512_mul_ps(cv, sv) : _mm512_fmadd_ps(cv, sv, _mm512_load_ps(total[t][r])));
            }
          }
        }
        if (b < nb) {
          _tile_stored(0, cbuf[b % 3][0], 64);
          _tile_stored(1, cbuf[b % 3][1], 64);
          _tile_stored(2, cbuf[b % 3][2], 64);
          _tile_stored(3, cbuf[b % 3][3], 64);
        }
      }
      amx::store_block(reinterpret_cast<uint16_t*>(p.out), p.m, p.n, total, bias32, p.bias != nullptr, n0, m0);
    }
  }
  amx::release();
}
#endif  // __AVX2__
}  // namespace keel::KEEL_CPU_NS
