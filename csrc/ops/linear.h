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

}  // namespace keel
