// deep_gemm/csrc/cuda/gemm.cu
// Portable (sm_80+) CUDA path of fp8_gemm_nt / bf16_gemm_nt: one warp per output element. Each
// lane reads 4 consecutive K elements, so one pass of the warp covers exactly one 128-wide K
// block, whose scale sfa[m, kb] * sfb[n / gran_n, kb] is applied to the lane's partial sum; e4m3
// and bf16 are decoded to fp32 in registers; a shuffle reduction gives D = C + A @ B.T.
// Written to be obviously correct, not fast (no tensor cores): a decode-shape fallback.
// UNVERIFIED: compiled and linked here, never run on a GPU.
#include <cuda_runtime.h>

#include <cstdint>

#include "csrc/cuda/launch.hpp"
#include "csrc/utils/exception.hpp"

namespace deep_gemm::cuda {
// a named namespace, not an anonymous one: nvcc names anonymous namespaces after the
// source file's absolute path, so the library's bytes would depend on the build folder
namespace gemm_detail {

constexpr int kWarps = 4;

__device__ __forceinline__ float e4m3_to_float(uint8_t v) {
  const int e = (v >> 3) & 0xF;
  const int m = v & 0x7;
  float mag;
  if (e == 0xF && m == 0x7) {
    mag = __int_as_float(0x7fc00000);
  } else if (e == 0) {
    mag = ldexpf(static_cast<float>(m), -9);
  } else {
    mag = ldexpf(static_cast<float>(8 + m), e - 10);
  }
  return (v & 0x80) ? -mag : mag;
}

__device__ __forceinline__ float bf16_to_float(uint16_t v) { return __uint_as_float(static_cast<uint32_t>(v) << 16); }

__device__ __forceinline__ uint16_t float_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

__device__ __forceinline__ float load_a(const GemmArgs& g, int64_t row, int64_t col) {
  return g.fp8 ? e4m3_to_float(static_cast<const uint8_t*>(g.a)[row * g.lda + col])
               : bf16_to_float(static_cast<const uint16_t*>(g.a)[row * g.lda + col]);
}

__device__ __forceinline__ float load_b(const GemmArgs& g, int64_t row, int64_t col) {
  return g.fp8 ? e4m3_to_float(static_cast<const uint8_t*>(g.b)[row * g.ldb + col])
               : bf16_to_float(static_cast<const uint16_t*>(g.b)[row * g.ldb + col]);
}

__global__ void gemm_nt_warp_kernel(const GemmArgs g) {
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (n >= g.n) return;
  for (int64_t m = blockIdx.y; m < g.m; m += gridDim.y) {
    float acc = 0.0f;
    for (int64_t k0 = 0; k0 < g.k; k0 += 128) {
      float part = 0.0f;
      for (int i = 0; i < 4; ++i) {
        const int64_t k = k0 + lane * 4 + i;
        if (k < g.k) part += load_a(g, m, k) * load_b(g, n, k);
      }
      if (g.fp8) {
        const int64_t kb = k0 / 128;
        part *= g.sfa[m * g.sfa_s0 + kb * g.sfa_s1] * g.sfb[(n / g.sfb_gran_n) * g.sfb_s0 + kb * g.sfb_s1];
      }
      acc += part;
    }
    for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) {
      if (g.c) {
        acc += g.c_fp32 ? static_cast<const float*>(g.c)[m * g.ldc0 + n * g.ldc1]
                        : bf16_to_float(static_cast<const uint16_t*>(g.c)[m * g.ldc0 + n * g.ldc1]);
      }
      if (g.d_fp32) {
        static_cast<float*>(g.d)[m * g.ldd0 + n * g.ldd1] = acc;
      } else {
        static_cast<uint16_t*>(g.d)[m * g.ldd0 + n * g.ldd1] = float_to_bf16(acc);
      }
    }
  }
}

void launch_gemm_nt(const GemmArgs& g, void* stream) {
  if (g.m == 0 || g.n == 0) return;
  const dim3 grid(static_cast<unsigned>((g.n + kWarps - 1) / kWarps), static_cast<unsigned>(g.m < 65535 ? g.m : 65535));
  gemm_nt_warp_kernel<<<grid, kWarps * 32, 0, static_cast<cudaStream_t>(stream)>>>(g);
  const cudaError_t err = cudaGetLastError();
  DG_HOST_ASSERT(err == cudaSuccess, g.op, ": CUDA launch failed: ", cudaGetErrorString(err));
}

[[maybe_unused]] const bool registered = register_gemm_launcher(&launch_gemm_nt);

}  // namespace gemm_detail
using namespace gemm_detail;  // the launchers below
}  // namespace deep_gemm::cuda
