// vendored_deps/flash_attn/src/cuda/flash_fwd_cuda.h
// The CUDA launcher (flash_fwd_cuda.cu): plain C++ struct in, cudaStream_t as void*.
#pragma once

#include "../flash.h"

namespace flash {

// Launches the forward kernel on `stream`; every pointer in `params` is device memory.
void run_mha_fwd_cuda(const Flash_fwd_params& params, void* stream);

}  // namespace flash
