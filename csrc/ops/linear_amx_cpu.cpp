// keel/csrc/ops/linear_amx_cpu.cpp
// AMX prompt GEMM of keel::linear for bf16 (compiled once per ISA, no torch header; the code exists only in
// the AVX2 build and runs only when keel::cpu_has_amx()).
//
// Layout trick: the weight is [N, K] with K contiguous, which is already an AMX A tile (16 weight rows x 32
// K values, loaded straight from the model's tensor with its row stride; no repacking, no copy of the
// weight). x is the B operand: the wrapper packs it once per call into the VNNI layout (pairs of K values
// per x row, 16 x rows per 64-byte tile row: amx::pack_x, a 16 x 16 32-bit transpose). The accumulator
// tile is then out^T: [16 weight rows][16 x rows] in fp32, transposed back on the store.
// Register block: 32 weight rows x 32 x rows = 4 accumulator tiles (tmm0..3), 2 A tiles (tmm4/5), 2 B tiles
// (tmm6/7); 4 tdpbf16ps per 32-wide K step.
//
// Summation order (defines the result; it differs from the AVX-512 path's): per output, an fp32
// accumulator starts at +0 and takes the K steps k0 = 0, 32, 64, ... in order, each one tdpbf16ps step over
// the 16 pairs of that step (the instruction's own order: products of bf16 pairs, exact in fp32, added
// pair by pair with round-to-nearest-even; bf16 subnormal inputs read as zero and subnormal results flush
// to zero, as vdpbf16ps does). Then the bias (when given) is added in fp32 and the sum rounded once to
// bf16, to nearest even. K past k is zero on both sides (x packed with zeros; a weight panel whose rows or
// K are partial is copied into a zero-padded buffer first), so tails add exact zeros. Every output is
// computed this way whichever block, thread or chunk it falls in: results never depend on the thread count
// or how N and M are split; they do depend on the ISA (the AVX-512 path sums 16 lanes in a tree).
#include <vector>

#include "ops/amx_common.h"
#include "ops/linear.h"

namespace keel::KEEL_CPU_NS {
#if defined(__AVX2__)

KEEL_AMX void linear_amx_pack(const LinearAmxParams& a, int64_t begin, int64_t end) {
  const LinearParams& p = *a.p;
  amx::pack_x(static_cast<const uint16_t*>(p.x16), p.k, p.m, p.k, a.kp, a.xpack, begin, end);
}

KEEL_AMX void linear_amx_cols(const LinearAmxParams& a, int64_t begin, int64_t end) {
  const LinearParams& p = *a.p;
  const int64_t kp = a.kp;
  const uint16_t* w = static_cast<const uint16_t*>(p.w);
  const bf16_t* bias = static_cast<const bf16_t*>(p.bias);
  thread_local std::vector<uint16_t> wpad;  // a partial panel, zero-padded to 32 rows x kp
  alignas(64) float cbuf[4][16][16];
  alignas(64) float bias32[kAmxBlockN];
  const int64_t group = (kp / 2) * 32;  // elements of one 16-row group of xpack
  amx::configure();
  for (int64_t nb = begin; nb < end; ++nb) {
    const int64_t n0 = nb * kAmxBlockN;
    const int64_t nv = p.n - n0 < kAmxBlockN ? p.n - n0 : kAmxBlockN;
    const uint16_t* wa = w + n0 * p.w_row;
    int64_t ws = p.w_row;  // elements between A tile rows
    if (nv < kAmxBlockN || p.k != kp) {
      wpad.assign(static_cast<size_t>(kAmxBlockN * kp), 0);
      for (int64_t r = 0; r < nv; ++r) std::memcpy(wpad.data() + r * kp, wa + r * p.w_row, sizeof(uint16_t) * p.k);
      wa = wpad.data();
      ws = kp;
    }
    for (int64_t j = 0; j < kAmxBlockN; ++j) bias32[j] = bias && j < nv ? load(bias + (n0 + j) * p.bias_stride) : 0.0f;
    for (int64_t m0 = 0; m0 < a.mp; m0 += kAmxBlockM) {
      const uint16_t* b0 = a.xpack + (m0 / 16) * group;
      const uint16_t* b1 = b0 + group;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t k0 = 0; k0 < kp; k0 += kAmxStepK) {
        // the next step's B tiles (2 x 1 KB, contiguous) into L1 while this step computes
        const char* nb0 = reinterpret_cast<const char*>(b0 + (k0 + kAmxStepK) * 16);
        const char* nb1 = reinterpret_cast<const char*>(b1 + (k0 + kAmxStepK) * 16);
#pragma GCC unroll 16
        for (int l = 0; l < 16; ++l) {
          _mm_prefetch(nb0 + 64 * l, _MM_HINT_T0);
          _mm_prefetch(nb1 + 64 * l, _MM_HINT_T0);
        }
        _tile_loadd(4, wa + k0, ws * 2);
        _tile_loadd(5, wa + 16 * ws + k0, ws * 2);
        _tile_loadd(6, b0 + k0 * 16, 64);
        _tile_loadd(7, b1 + k0 * 16, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, cbuf[0], 64);
      _tile_stored(1, cbuf[1], 64);
      _tile_stored(2, cbuf[2], 64);
      _tile_stored(3, cbuf[3], 64);
      amx::store_block(static_cast<uint16_t*>(p.out), p.m, p.n, cbuf, bias32, p.bias != nullptr, n0, m0);
    }
  }
  amx::release();
}
#endif  // __AVX2__
}  // namespace keel::KEEL_CPU_NS
