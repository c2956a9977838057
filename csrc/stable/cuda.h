// keel/csrc/stable/cuda.h
// CUDA device guard and current stream for op wrappers (compiled only into _C_cuda).
#pragma once

#ifndef USE_CUDA
#error "stable/cuda.h is for the CUDA library only (compile with -DUSE_CUDA)"
#endif

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>

#include "stable/tensor.h"

namespace keel {

using DeviceGuard = torch::stable::accelerator::DeviceGuard;

// The current CUDA stream (a cudaStream_t, as void*) of the device `t` lives on.
inline void* current_cuda_stream(const Tensor& t) {
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(t.get_device_index(), &stream));
  return stream;
}

}  // namespace keel
