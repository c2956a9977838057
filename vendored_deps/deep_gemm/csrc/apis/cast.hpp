// deep_gemm/csrc/apis/cast.hpp
// The casts of upstream's deep_gemm.utils (Python there, C++ here), writing into given views:
//   per_token_cast_to_fp8: x [M, K] -> out e4m3 [M, K], sf fp32 [M, ceil(K/gran_k)]  (1 x gran_k groups)
//   per_block_cast_to_fp8: x [N, K] -> out e4m3 [N, K], sf fp32 [ceil(N/128), ceil(K/128)]
// x is bfloat16 or float32. Each group's scale is amax / 448 (amax clamped below at 1e-4, as
// upstream); with use_ue8m0 the scale is rounded up to a power of two. Values are divided by
// the scale and rounded to nearest even, saturating at +-448. Views on the CPU or on one CUDA device
// (`stream`: the cudaStream_t for CUDA views); both paths write the same bytes.
#pragma once

#include "csrc/utils/tensor_view.hpp"

namespace deep_gemm {

void per_token_cast_to_fp8(const TensorView& x, const TensorView& out, const TensorView& sf, bool use_ue8m0 = false,
                           int gran_k = 128, void* stream = nullptr);

void per_block_cast_to_fp8(const TensorView& x, const TensorView& out, const TensorView& sf, bool use_ue8m0 = false,
                           void* stream = nullptr);

}  // namespace deep_gemm
