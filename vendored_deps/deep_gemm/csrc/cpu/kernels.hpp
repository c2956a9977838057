// deep_gemm/csrc/cpu/kernels.hpp
// CPU GEMM kernels, compiled once per ISA (namespace cpu_base / cpu_avx2 / cpu_avx512).
// gemm_nt_rows computes output columns [n_begin, n_end) of D = C + A @ B.T for all rows of A.
#pragma once

#include <cstdint>

#include "csrc/utils/tensor_view.hpp"

namespace deep_gemm::cpu {

struct GemmParams {
  const float* a = nullptr;  // [m, lda] fp32: A dequantized (sfa applied) or widened bf16, zero past k
  int64_t lda = 0;           // k rounded up to a multiple of 128
  // AVX512-BF16 build, fp8 only (with `a`, used for blocks of B that hold e4m3 subnormals): A's e4m3
  // values times 2^64 as bf16 (exact), [m, lda], zero past k, and sfa as [m, lda / 128] contiguous
  const uint16_t* a16 = nullptr;
  const float* sfa = nullptr;
  const void* b = nullptr;  // [n, k] rows of e4m3 or bf16, unit stride along k
  DType b_dtype = DType::kFloat8E4M3;
  int64_t ldb = 0;
  const float* sfb = nullptr;  // fp8 only: [ceil(n/sfb_gran_n), ceil(k/128)]
  int64_t sfb_s0 = 0, sfb_s1 = 0;
  int64_t sfb_gran_n = 128;  // rows of B per scale: 128 (recipe (1, 128, 128)) or 1 (recipe (1, 1, 128))
  int64_t m = 0, n = 0, k = 0;
  void* d = nullptr;
  DType d_dtype = DType::kBFloat16;
  int64_t ldd0 = 0, ldd1 = 0;
  const void* c = nullptr;  // optional
  DType c_dtype = DType::kFloat32;
  int64_t ldc0 = 0, ldc1 = 0;
};

}  // namespace deep_gemm::cpu

#define DG_DECLARE_CPU_KERNELS(ns)                                             \
  namespace deep_gemm::ns {                                                    \
  void gemm_nt_rows(const cpu::GemmParams& p, int64_t n_begin, int64_t n_end); \
  }

DG_DECLARE_CPU_KERNELS(cpu_base)
DG_DECLARE_CPU_KERNELS(cpu_avx2)
DG_DECLARE_CPU_KERNELS(cpu_avx512)

namespace deep_gemm::cpu {
// 2^64: A's bf16 copy is scaled up so products with B's 2^-120-scaled bf16 stay normal fp32 numbers
constexpr float kBf16DotAShift = 18446744073709551616.0f;
}  // namespace deep_gemm::cpu
