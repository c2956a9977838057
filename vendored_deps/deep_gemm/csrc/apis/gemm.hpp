// deep_gemm/csrc/apis/gemm.hpp
// Upstream's GEMM entry points, "nt" = A row-major [M, K], B row-major [N, K] (both K-major):
//   D = C + A @ B.T
// fp8_gemm_nt: A float8_e4m3fn with per-token 1x128 scales sfa [M, ceil(K/128)] (fp32),
//              B float8_e4m3fn with 128x128 block scales sfb [ceil(N/128), ceil(K/128)] (fp32),
//              or 1x128 scales sfb [N, ceil(K/128)] with recipe (1, 1, 128);
//              D bfloat16 or float32, C (optional) bfloat16 or float32, all [M, N].
// bf16_gemm_nt: A, B bfloat16; D, C as above.
// Tensors are views on the CPU or on one CUDA device (see `stream`).
#pragma once

#include <optional>
#include <tuple>
#include <utility>

#include "csrc/utils/tensor_view.hpp"

namespace deep_gemm {

// `recipe` is upstream's scale granularity (m, n, k) of sfa/sfb: (1, 128, 128) (the default: B in
// 128x128 blocks) or (1, 1, 128) (upstream's "1D1D": B scaled per row and 128-wide K group, sfb
// [N, ceil(K/128)]); `disable_ue8m0_cast` is accepted for call-shape compatibility (scales here
// are always fp32, never packed UE8M0). `stream` is the cudaStream_t for CUDA views.
void fp8_gemm_nt(const std::pair<TensorView, TensorView>& a, const std::pair<TensorView, TensorView>& b,
                 const TensorView& d, const std::optional<TensorView>& c,
                 std::optional<std::tuple<int, int, int>> recipe = std::nullopt, bool disable_ue8m0_cast = false,
                 void* stream = nullptr);

void bf16_gemm_nt(const TensorView& a, const TensorView& b, const TensorView& d, const std::optional<TensorView>& c,
                  void* stream = nullptr);

}  // namespace deep_gemm
