// deep_gemm/csrc/cuda/launch.hpp
// The host <-> CUDA boundary of the fork: plain pointers, strides and a cudaStream_t (as void*).
// The CUDA objects register their launchers at load time; a library built without them has none,
// and CUDA views get a clear error. A launch failure throws DGException naming `op`.
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
  const char* op = "deep_gemm::gemm_nt";  // named in launch errors
};

using GemmLauncher = void (*)(const GemmArgs& args, void* stream);

// Called by the CUDA objects' static initializer.
bool register_gemm_launcher(GemmLauncher fn);

// The registered launcher, or nullptr in a CPU-only build.
GemmLauncher gemm_launcher();

// One cast: x [rows, cols] (bf16 or fp32, any strides) -> out e4m3 [rows, cols] and one fp32 scale per
// gran_rows x gran_cols group in sf [ceil(rows/gran_rows), ceil(cols/gran_cols)] (any strides). The
// kernels compute exactly what the CPU casts compute (csrc/apis/cast.cpp), byte for byte.
struct CastArgs {
  const void* x = nullptr;
  bool x_fp32 = false;
  int64_t rows = 0, cols = 0;
  int64_t xs0 = 0, xs1 = 0;
  uint8_t* out = nullptr;
  int64_t os0 = 0, os1 = 0;
  float* sf = nullptr;
  int64_t ss0 = 0, ss1 = 0;
  int64_t gran_rows = 1, gran_cols = 128;  // per-token: 1 x gran_k; per-block: 128 x 128
  bool use_ue8m0 = false;
  const char* op = "deep_gemm::cast";  // named in launch errors
};

using CastLauncher = void (*)(const CastArgs& args, void* stream);

bool register_cast_launcher(CastLauncher fn);

// The registered cast launcher, or nullptr in a CPU-only build.
CastLauncher cast_launcher();

}  // namespace deep_gemm::cuda
