// keel/csrc/ops/fp8_linear_amx.h
// AMX prompt GEMM of keel::fp8_linear for bf16 x (fp8_linear_amx_cpu.cpp; AVX2 build only, run when
// keel::cpu_has_amx()): y[m, n] = sum_b scale[n, b] * (sum_{k in block b} x[m, k] * w[n, k]) + bias[n].
#pragma once

#include <cstdint>

#include "ops/cpu_isa.h"
#include "ops/fp8_linear.h"
#include "stable/kernel_types.h"

namespace keel {

// Every bf16 call takes the AMX kernel, whatever its row count (one summation order per process). Decode
// on AMX may be slower than the AVX512-BF16 GEMV (their crossover:
// docs/measurements/2026-12-02-amx-prompt-kernels.md); not measured on an AMX CPU yet (docs/ops.md,
// determinism).
constexpr int64_t kFp8AmxBlockN = 32;  // weight rows decoded together (two 16-row A tiles)
constexpr int64_t kFp8AmxBlockM = 32;  // x rows per register block (two 16-row B tiles)

struct Fp8AmxParams {
  const uint16_t* x;  // bf16 [m, k], row i at x + i * x_row, unit column stride
  int64_t x_row;
  uint16_t* xpack;   // [mp / 16][kp / 2][16][2]: x in the B-tile layout (amx::pack_x), zero past m and k
  int64_t kp;        // k rounded up to kFp8BlockK
  int64_t mp;        // m rounded up to kFp8AmxBlockM
  const uint8_t* w;  // e4m3 bytes [n, k]: row r at w + r * w_row
  int64_t w_row;
  const float* scale;  // block (r, b) scales by scale[(r / scale_rows) * scale_s0 + b * scale_s1]
  int64_t scale_rows;
  int64_t scale_s0;
  int64_t scale_s1;
  const bf16_t* bias;  // [n] every bias_stride elements, or nullptr
  int64_t bias_stride;
  bf16_t* out;  // contiguous [m, n]
  int64_t m;
  int64_t n;
  int64_t k;
};

namespace cpu_avx2 {
// Packs 16-row groups [begin, end) of x into xpack.
void fp8_linear_amx_pack(const Fp8AmxParams& p, int64_t begin, int64_t end);
// Output features of the kFp8AmxBlockN-wide blocks [begin, end), all rows.
void fp8_linear_amx_cols(const Fp8AmxParams& p, int64_t begin, int64_t end);
}  // namespace cpu_avx2

}  // namespace keel
