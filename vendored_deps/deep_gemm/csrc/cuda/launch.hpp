// deep_gemm/csrc/cuda/launch.hpp
// The host <-> CUDA boundary of the fork: plain pointers, strides and a cudaStream_t (as void*).
// The CUDA objects register their launcher at load time; a library built without them has none,
// and CUDA views get a clear error.
#pragma once

#include <cstdint>

#include "csrc/utils/tensor_view.hpp"

namespace deep_gemm::cuda {

struct GemmArgs {
  bool fp8 = true;          // A, B e4m3 with scales; otherwise A, B bf16
  const void* a = nullptr;  // [m, k], row stride lda, unit stride along k
  int64_t lda = 0;
  const float* sfa = nullptr;  // [m, ceil(k/128)]
  int64_t sfa_s0 = 0, sfa_s1 = 0;
  const void* b = nullptr;  // [n, k], row stride ldb
  int64_t ldb = 0;
  const float* sfb = nullptr;  // [ceil(n/sfb_gran_n), ceil(k/128)]
  int64_t sfb_s0 = 0, sfb_s1 = 0;
  int64_t sfb_gran_n = 128;
  int64_t m = 0, n = 0, k = 0;
  void* d = nullptr;
  bool d_fp32 = false;
  int64_t ldd0 = 0, ldd1 = 0;
  const void* c = nullptr;
  bool c_fp32 = false;
  int64_t ldc0 = 0, ldc1 = 0;
};

using GemmLauncher = void (*)(const GemmArgs& args, void* stream);

// Called by the CUDA objects' static initializer.
bool register_gemm_launcher(GemmLauncher fn);

// The registered launcher, or nullptr in a CPU-only build.
GemmLauncher gemm_launcher();

}  // namespace deep_gemm::cuda
