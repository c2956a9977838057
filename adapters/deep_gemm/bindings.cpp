// keel/adapters/deep_gemm/bindings.cpp
// Every schema of `keel_deep_gemm`, in one place. Upstream's pairs (a, sfa), (b, sfb) are split
// into separate tensors and its recipe tuple into three ints, because the stable dispatcher
// carries neither tuples nor 32-bit scalars; keel/vendored/deep_gemm re-packs upstream's call shape.
#include "stable/library.h"

STABLE_TORCH_LIBRARY(keel_deep_gemm, m) {
  // d = c + a @ b.T for a e4m3 [M, K] with 1x128 scales sfa and b e4m3 [N, K] with scales sfb: per 128x128 block
  // (recipe (1, 128, 128), the default when no recipe is given) or per 1x128 group of a row (recipe (1, 1, 128), what
  // keel's FP8 linear uses by default); writes d.
  m.def(
      "fp8_gemm_nt(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor(a!) d, Tensor? c=None, int? recipe_m=None, "
      "int? recipe_n=None, int? recipe_k=None, bool disable_ue8m0_cast=False) -> ()");
  // d = c + a @ b.T for bfloat16 a [M, K], b [N, K]; writes d (bfloat16 or float32).
  m.def("bf16_gemm_nt(Tensor a, Tensor b, Tensor(a!) d, Tensor? c=None) -> ()");
  // x [M, K] -> (e4m3 [M, K], fp32 scales [M, ceil(K / gran_k)]), one scale per 1 x gran_k group.
  m.def("per_token_cast_to_fp8(Tensor x, bool use_ue8m0=False, int gran_k=128) -> (Tensor, Tensor)");
  // x [N, K] -> (e4m3 [N, K], fp32 scales [ceil(N / 128), ceil(K / 128)]), one scale per 128 x 128 block.
  m.def("per_block_cast_to_fp8(Tensor x, bool use_ue8m0=False) -> (Tensor, Tensor)");
}
