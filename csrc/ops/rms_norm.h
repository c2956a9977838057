// keel/csrc/ops/rms_norm.h
// RMS normalization over the last dim, optionally fused with a residual add.
// Shared by keel::rms_norm and keel::fused_add_rms_norm (residual != nullptr):
//   residual = x + residual; x = rms_norm(residual)   (both written in place)
#pragma once

#include <cstdint>

#include "ops/cpu_isa.h"
#include "stable/kernel_types.h"

namespace keel {

struct RmsNormParams {
  DType dtype;
  const void* x;  // rows via x_rows, elements every x_col
  RowLayout x_rows;
  int64_t x_col;
  void* out;  // rows via out_rows, elements every out_col (== x for the fused op)
  RowLayout out_rows;
  int64_t out_col;
  void* residual;  // nullptr for plain rms_norm
  RowLayout res_rows;
  int64_t res_col;
  const void* weight;  // [hidden], elements every w_col
  int64_t w_col;
  int64_t rows;
  int64_t hidden;
  float eps;
};

KEEL_DECLARE_CPU_KERNEL(rms_norm_rows, RmsNormParams)

// Launches on `stream` (a cudaStream_t). Defined in rms_norm.cu.
void rms_norm_cuda(const RmsNormParams& p, void* stream);

}  // namespace keel
