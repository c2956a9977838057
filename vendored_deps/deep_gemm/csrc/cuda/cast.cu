// deep_gemm/csrc/cuda/cast.cu
// CUDA casts to e4m3 with fp32 scales (sm_80+): per-token 1 x gran_k groups (the engine's activations
// and its 1x128 weight recipe; one warp per group) and 128 x 128 blocks (one thread block per group): the
// group's amax (fmaxf, which ignores NaN as the host's std::fmax does), the scale, then every element divided
// by it (IEEE division, __fdiv_rn, whatever the compile flags) and rounded to e4m3 with the same bit
// arithmetic as csrc/utils/fp8.hpp, so the bytes equal the CPU casts' (csrc/apis/cast.cpp).
// UNVERIFIED: compiled and linked here, never run on a GPU.
#include <cuda_runtime.h>

#include <cstdint>

#include "csrc/cuda/launch.hpp"
#include "csrc/utils/exception.hpp"

namespace deep_gemm::cuda {
// a named namespace, not an anonymous one: nvcc names anonymous namespaces after the
// source file's absolute path, so the library's bytes would depend on the build folder
namespace cast_detail {

constexpr int kMaxThreads = 256;
constexpr float kAmaxFloor = 1e-4f;  // as the host casts
constexpr float kFp8E4M3Max = 448.0f;

__device__ __forceinline__ float load_x(const CastArgs& a, int64_t r, int64_t c) {
  const int64_t i = r * a.xs0 + c * a.xs1;
  if (a.x_fp32) return static_cast<const float*>(a.x)[i];
  return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(a.x)[i]) << 16);
}

// fp8.hpp's ue8m0_ceil: the smallest power of two >= s
__device__ __forceinline__ float ue8m0_ceil(float s) {
  uint32_t u = __float_as_uint(s);
  if ((u & 0x7FFFFFu) != 0 && ((u >> 23) & 0xFFu) != 0xFFu) u = (u + 0x800000u) & 0xFF800000u;
  return __uint_as_float(u);
}

// fp8.hpp's float_to_e4m3: nearest even, saturating at +-448, NaN -> NaN
__device__ __forceinline__ uint8_t float_to_e4m3(float x) {
  const uint32_t u = __float_as_uint(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const float a = fabsf(x);
  if (isnan(a)) return sign | 0x7F;
  if (a >= kFp8E4M3Max) return sign | 0x7E;
  if (a < 0.015625f) return sign | static_cast<uint8_t>(rintf(a * 512.0f));  // subnormals: multiples of 2^-9
  uint32_t au = __float_as_uint(a);
  au += 0x7FFFFu + ((au >> 20) & 1u);
  const int e = static_cast<int>(au >> 23) - 127 + 7;
  const uint32_t m = (au >> 20) & 0x7u;
  return sign | static_cast<uint8_t>((e << 3) | m);
}

// max over the block (blockDim.x a multiple of 32)
__device__ __forceinline__ float block_max(float v) {
  __shared__ float warp_max[kMaxThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_max[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x / 32) ? warp_max[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) warp_max[0] = v;
  }
  __syncthreads();
  return warp_max[0];
}

__global__ void __launch_bounds__(kMaxThreads) cast_kernel(const CastArgs a, int64_t col_groups) {
  const int64_t g = blockIdx.x;
  const int64_t gr = g / col_groups, gc = g - gr * col_groups;
  const int64_t r0 = gr * a.gran_rows, c0 = gc * a.gran_cols;
  const int64_t nr = a.rows - r0 < a.gran_rows ? a.rows - r0 : a.gran_rows;
  const int64_t nc = a.cols - c0 < a.gran_cols ? a.cols - c0 : a.gran_cols;
  const int64_t n = nr * nc;
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t r = r0 + i / nc, c = c0 + i % nc;
    amax = fmaxf(amax, fabsf(load_x(a, r, c)));
  }
  amax = block_max(amax);
  const float s = __fdiv_rn(amax > kAmaxFloor ? amax : kAmaxFloor, kFp8E4M3Max);
  const float scale = a.use_ue8m0 ? ue8m0_ceil(s) : s;
  if (threadIdx.x == 0) a.sf[gr * a.ss0 + gc * a.ss1] = scale;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t r = r0 + i / nc, c = c0 + i % nc;
    a.out[r * a.os0 + c * a.os1] = float_to_e4m3(__fdiv_rn(load_x(a, r, c), scale));
  }
}

// Per-token groups (1 x gran_cols): one warp per group, kWarpsPerBlock groups per block; the amax by shuffles (no
// shared memory, no barrier); lane i reads elements i, i + 32, ... of its group (coalesced along a row). The same
// arithmetic as cast_kernel, so the same bytes.
constexpr int kWarpsPerBlock = kMaxThreads / 32;

__global__ void __launch_bounds__(kMaxThreads)
    cast_rows_warp_kernel(const CastArgs a, int64_t col_groups, int64_t groups) {
  const int lane = threadIdx.x % 32;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (g >= groups) return;  // the whole warp: no barrier follows
  const int64_t r = g / col_groups, gc = g - r * col_groups;
  const int64_t c0 = gc * a.gran_cols;
  const int64_t nc = a.cols - c0 < a.gran_cols ? a.cols - c0 : a.gran_cols;
  float amax = 0.0f;
  for (int64_t i = lane; i < nc; i += 32) amax = fmaxf(amax, fabsf(load_x(a, r, c0 + i)));
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = __fdiv_rn(amax > kAmaxFloor ? amax : kAmaxFloor, kFp8E4M3Max);
  const float scale = a.use_ue8m0 ? ue8m0_ceil(s) : s;
  if (lane == 0) a.sf[r * a.ss0 + gc * a.ss1] = scale;
  for (int64_t i = lane; i < nc; i += 32) {
    a.out[r * a.os0 + (c0 + i) * a.os1] = float_to_e4m3(__fdiv_rn(load_x(a, r, c0 + i), scale));
  }
}

// rows, cols > 0 and at most 2^31 - 1 groups (checked by the caller, csrc/apis/cast.cpp)
void launch_cast(const CastArgs& a, void* stream) {
  const int64_t row_groups = (a.rows + a.gran_rows - 1) / a.gran_rows;
  const int64_t col_groups = (a.cols + a.gran_cols - 1) / a.gran_cols;
  const auto s = static_cast<cudaStream_t>(stream);
  if (a.gran_rows == 1) {  // per-token: a warp per group
    const int64_t groups = row_groups * col_groups;
    const int64_t blocks = (groups + kWarpsPerBlock - 1) / kWarpsPerBlock;
    cast_rows_warp_kernel<<<static_cast<unsigned>(blocks), kMaxThreads, 0, s>>>(a, col_groups, groups);
  } else {  // 128 x 128 blocks: a thread block per group
    const int64_t per_group = a.gran_rows * a.gran_cols;
    const int threads = per_group >= kMaxThreads ? kMaxThreads : static_cast<int>((per_group + 31) / 32 * 32);
    cast_kernel<<<static_cast<unsigned>(row_groups * col_groups), threads, 0, s>>>(a, col_groups);
  }
  const cudaError_t err = cudaGetLastError();
  DG_HOST_ASSERT(err == cudaSuccess, a.op, ": CUDA launch failed: ", cudaGetErrorString(err));
}

[[maybe_unused]] const bool registered = register_cast_launcher(&launch_cast);

}  // namespace cast_detail
}  // namespace deep_gemm::cuda
