// keel/csrc/ops/linear.h
// y[m, n] = sum_k x[m, k] * w[n, k] + bias[n] for few rows m (decode GEMV), fp32 accumulation.
#pragma once

#include <cstdint>

#include "ops/cpu_isa.h"
#include "stable/kernel_types.h"

namespace keel {

// Rows of x the CPU kernel takes in one pass over the weight (more rows: several passes).
constexpr int64_t kLinearRowBlock = 32;

struct LinearParams {
  DType dtype;      // of w, bias and out
  void* out;        // contiguous [m, n]
  const float* x;   // contiguous fp32 [m, k] (converted once by the wrapper), or nullptr when x16 is set
  const void* x16;  // set only when cpu_has_avx512bf16(): contiguous bf16 [m, k], read with vdpbf16ps
  const void* w;    // [n, k]: row r at w + r * w_row, unit column stride
  int64_t w_row;
  const void* bias;  // [n] every bias_stride elements, or nullptr
  int64_t bias_stride;
  int64_t m;
  int64_t n;
  int64_t k;
};

// Output features [begin, end) for all m rows; each weight row is streamed from memory once.
KEEL_DECLARE_CPU_KERNEL(linear_cols, LinearParams)

// keel::linear on the CPU after its checks: out [m, n] = x [m, k] @ w^T + bias, x contiguous rows and out, bias and
// w in dtype dt (w row r at w + r * w_row, bias every bias_stride elements or nullptr). The fused layer ops run their
// projections through it too, so a projection gives the op's bits wherever it runs.
void linear_cpu(DType dt, const void* x, int64_t m, int64_t k, const void* w, int64_t w_row, int64_t n,
                const void* bias, int64_t bias_stride, void* out);

// ---- AMX GEMM (linear_amx_cpu.cpp; AVX2 build only, run when cpu_has_amx()) -------------------------------------
// Every bf16 call, whatever its row count (one summation order per process). Decode on AMX may be
// slower than the AVX512-BF16 GEMV (their crossover: docs/measurements/2026-12-02-amx-prompt-kernels.md);
// not measured on an AMX CPU yet (docs/ops.md, determinism).
constexpr int64_t kAmxBlockM = 32;  // x rows per register block (two 16-row B tiles)
constexpr int64_t kAmxBlockN = 32;  // weight rows per register block (two 16-row A tiles)
constexpr int64_t kAmxStepK = 32;   // bf16 elements of K per tdpbf16ps

// x in the AMX B-tile layout: for each 16-row group g of x and each pair j of K,
// xpack[((g * kp / 2) + j) * 32 + 2 * r + t] = x[16 g + r][2 j + t], zero past m and k (kp: k rounded up to
// kAmxStepK, rows rounded up to kAmxBlockM). A B tile is then 16 consecutive 64-byte rows.
struct LinearAmxParams {
  const LinearParams* p;  // p->x16 (bf16 [m, k], contiguous), p->w, p->out, p->bias, m, n, k
  uint16_t* xpack;        // [mp / 16][kp / 2][16][2]
  int64_t kp;             // k rounded up to kAmxStepK
  int64_t mp;             // m rounded up to kAmxBlockM
};

namespace cpu_avx2 {
// Packs 16-row groups [begin, end) of x into xpack.
void linear_amx_pack(const LinearAmxParams& a, int64_t begin, int64_t end);
// Output features of the kAmxBlockN-wide blocks [begin, end), all rows.
void linear_amx_cols(const LinearAmxParams& a, int64_t begin, int64_t end);
}  // namespace cpu_avx2

}  // namespace keel
