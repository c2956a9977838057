// keel/csrc/ops/silu_and_mul.h
// out[..., i] = silu(x[..., i]) * x[..., d + i] for x of last dim 2d (SwiGLU gate).
#pragma once

#include <cstdint>

#include "ops/cpu_isa.h"
#include "stable/kernel_types.h"

namespace keel {

struct SiluAndMulParams {
  DType dtype;
  void* out;      // contiguous [rows, d]
  const void* x;  // rows via x_rows, elements every x_col
  RowLayout x_rows;
  int64_t x_col;
  int64_t rows;
  int64_t d;
};

KEEL_DECLARE_CPU_KERNEL(silu_and_mul_rows, SiluAndMulParams)

// Launches on `stream` (a cudaStream_t). Defined in silu_and_mul.cu.
void silu_and_mul_cuda(const SiluAndMulParams& p, void* stream);

}  // namespace keel
