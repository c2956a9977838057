// keel/csrc/ops/cuda_common.cuh
// Device-side helpers for keel's CUDA launchers: dtype mapping, float load/store,
// block reduction, launch error check. CUDA headers only, no torch header.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "stable/kernel_types.h"

// Device-side argument check, with no host sync: a failing check skips the caller's memory
// access (the caller returns) and raises a device-side assert, which CUDA reports at the next
// synchronizing call as cudaErrorAssert, with `msg` on stderr. As with torch's own device-side
// index checks, the CUDA context is unusable afterwards. Independent of NDEBUG.
#define KEEL_DEVICE_CHECK(cond, msg)                    \
  do {                                                  \
    if (!(cond)) {                                      \
      __assert_fail(msg, __FILE__, __LINE__, __func__); \
      return;                                           \
    }                                                   \
  } while (0)

namespace keel::cuda {

__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ float load(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ double load(const double* p) { return *p; }
__device__ __forceinline__ void store(double* p, double v) { *p = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }

template <typename T>
__device__ __forceinline__ float round_to(float v) {
  T t;
  store(&t, v);
  return load(&t);
}

// 16-byte vectors of T (8 bf16 / fp16, 4 fp32, 2 fp64): one 128-bit load or store. Callers check
// aligned16 on every pointer (uniform over the block or the grid) and take a scalar path otherwise and for the
// tail of a row that is not a multiple of the vector.
template <typename T>
struct alignas(16) Vec16 {
  static constexpr int n = 16 / sizeof(T);
  T e[n];
};
__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
template <typename T>
__device__ __forceinline__ Vec16<T> load16(const T* p) {
  return *reinterpret_cast<const Vec16<T>*>(p);
}
template <typename T>
__device__ __forceinline__ void store16(T* p, const Vec16<T>& v) {
  *reinterpret_cast<Vec16<T>*>(p) = v;
}

// Sum of `v` over the block (blockDim.x a multiple of 32, at most 1024).
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float warp_sums[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  const int nwarps = (blockDim.x + 31) >> 5;
  v = (threadIdx.x < nwarps) ? warp_sums[threadIdx.x] : 0.f;
  if (warp == 0) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) warp_sums[0] = v;
  }
  __syncthreads();
  const float total = warp_sums[0];
  __syncthreads();
  return total;
}

// Grid of a kernel that loops over its rows (or elements) with a grid stride: at most kMaxGridBlocks blocks,
// so a row count above CUDA's grid limit (2^31 - 1 blocks) cannot wrap around in a cast to unsigned; rows
// past the grid are taken by the same blocks in later turns. 2^20 blocks keep every SM busy.
constexpr int64_t kMaxGridBlocks = int64_t(1) << 20;
inline unsigned grid_blocks(int64_t rows) {
  return static_cast<unsigned>(rows < kMaxGridBlocks ? (rows > 0 ? rows : 1) : kMaxGridBlocks);
}

// Throws with the op's name when the launch failed.
inline void check_launch(const char* op) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(op) + ": CUDA launch failed: " + cudaGetErrorString(err));
  }
}

// Calls f.template operator()<T>() with T the CUDA type of `dt`.
template <typename F>
inline void dispatch_float(DType dt, F&& f) {
  switch (dt) {
    case DType::kFloat32:
      f(float{});
      break;
    case DType::kBFloat16:
      f(__nv_bfloat16{});
      break;
    case DType::kFloat16:
      f(__half{});
      break;
    case DType::kFloat64:
      break;  // only fused_muladd takes float64; it dispatches that itself
  }
}

}  // namespace keel::cuda
