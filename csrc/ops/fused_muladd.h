// keel/csrc/ops/fused_muladd.h
// out = a * b + c, elementwise. Torch-free parameters shared by the CPU kernel and
// the CUDA launcher.
#pragma once

#include <cstdint>

#include "ops/cpu_isa.h"
#include "stable/kernel_types.h"

namespace keel {

struct FusedMulAddParams {
  DType dtype;
  void* out;      // contiguous [rows, cols]
  const void* a;  // rows via a_rows, columns every a_col elements
  const void* b;
  RowLayout a_rows;
  RowLayout b_rows;
  int64_t a_col;
  int64_t b_col;
  int64_t rows;
  int64_t cols;  // columns per row (the last row may be shorter)
  int64_t numel;
  double c;  // rounded to float for the float32 and 16-bit dtypes
};

// Processes rows [begin, end). A contiguous pair is one row of numel columns.
KEEL_DECLARE_CPU_KERNEL(fused_muladd_rows, FusedMulAddParams)

// Launches on `stream` (a cudaStream_t). Defined in fused_muladd.cu.
void fused_muladd_cuda(const FusedMulAddParams& p, void* stream);

}  // namespace keel
