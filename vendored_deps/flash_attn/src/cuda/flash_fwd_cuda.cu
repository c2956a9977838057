// vendored_deps/flash_attn/src/cuda/flash_fwd_cuda.cu
// CUDA forward attention for sm_80+: a straightforward tiled online-softmax kernel (not
// upstream's CUTLASS kernels). One warp per (query row, head); keys in tiles of 32: each lane
// scores one key of the tile, the warp takes the tile's max and sum once, then every lane
// accumulates its slice of the head dim over the tile's values. fp32 accumulation; paged K/V
// through the block table; the same mask rules as the CPU kernels. Three instantiations (dtypes).
// No split-K on CUDA (num_splits is ignored). Compiled only in keel's build: UNVERIFIED on a GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "../block_info.h"
#include "../flash_api.h"
#include "flash_fwd_cuda.h"

namespace flash {
// a named namespace, not an anonymous one: nvcc names anonymous namespaces after the
// source file's absolute path, so the library's bytes would depend on the build folder
namespace flash_fwd_cuda_detail {

constexpr int kWarps = 4;   // query rows per block
constexpr int kMaxD = 256;  // head dim limit (checked on the host)
constexpr int kPerLane = kMaxD / 32;
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

template <typename T>
__global__ void __launch_bounds__(kWarps * 32) flash_fwd_kernel(const Flash_fwd_params p) {
  __shared__ float q_s[kWarps][kMaxD];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x * kWarps + warp;
  const BlockInfo seq = block_info(p, b);
  if (i >= seq.sq) return;  // whole warp leaves together; no block-wide barrier follows

  const int hk = h / p.h_h_k_ratio, d = p.d;
  const T* q = static_cast<const T*>(p.q_ptr) + seq.q_off + int64_t(i) * p.q_row_stride + int64_t(h) * p.q_head_stride;
  for (int c = lane; c < d; c += 32) q_s[warp][c] = to_float(q[c]);
  __syncwarp();

  const KeyRange vis = visible_keys(p, seq, i);
  const int lo = vis.lo, hi = vis.hi;
  const T* k = static_cast<const T*>(p.k_ptr);
  const T* v = static_cast<const T*>(p.v_ptr);

  float m = -INFINITY, l = 0.f;
  float acc[kPerLane];
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) acc[t] = 0.f;

  for (int t0 = lo; t0 < hi; t0 += 32) {
    const int j = t0 + lane;
    float s = -INFINITY;
    if (j < hi) {
      const T* kr = k + kv_row(p, b, j, false) + int64_t(hk) * p.k_head_stride;
      float dot = 0.f;
      for (int c = 0; c < d; ++c) dot += q_s[warp][c] * to_float(kr[c]);
      s = p.softcap > 0.f ? p.scale_softmax * tanhf(dot * p.softcap) : dot * p.scale_softmax;
    }
    const float m_new = fmaxf(m, warp_max(s));  // finite: key t0 is visible
    const float alpha = m == -INFINITY ? 0.f : __expf(m - m_new);
    const float pj = j < hi ? __expf(s - m_new) : 0.f;
    l = l * alpha + warp_sum(pj);
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) acc[t] *= alpha;
    const int nk = min(32, hi - t0);
    for (int jj = 0; jj < nk; ++jj) {
      const float pb = __shfl_sync(kFull, pj, jj);
      const T* vr = v + kv_row(p, b, t0 + jj, true) + int64_t(hk) * p.v_head_stride;
#pragma unroll
      for (int t = 0; t < kPerLane; ++t) {
        const int c = lane + 32 * t;
        if (c < d) acc[t] += pb * to_float(vr[c]);
      }
    }
    m = m_new;
  }

  const float inv = l > 0.f ? 1.f / l : 0.f;  // no visible key: 0, as upstream
  T* out = static_cast<T*>(p.o_ptr) + seq.o_off + int64_t(i) * p.o_row_stride + int64_t(h) * p.o_head_stride;
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const int c = lane + 32 * t;
    if (c < d) out[c] = from_float<T>(acc[t] * inv);
  }
}

}  // namespace flash_fwd_cuda_detail
using namespace flash_fwd_cuda_detail;  // the launchers below

void run_mha_fwd_cuda(const Flash_fwd_params& params, void* stream) {
  if (params.d > kMaxD) throw std::invalid_argument("head_size must be <= 256 on CUDA");
  const dim3 grid((params.seqlen_q + kWarps - 1) / kWarps, params.h, params.b);
  const auto s = static_cast<cudaStream_t>(stream);
  switch (params.dtype) {
    case DType::kFloat32:
      flash_fwd_kernel<float><<<grid, kWarps * 32, 0, s>>>(params);
      break;
    case DType::kBFloat16:
      flash_fwd_kernel<__nv_bfloat16><<<grid, kWarps * 32, 0, s>>>(params);
      break;
    case DType::kFloat16:
      flash_fwd_kernel<__half><<<grid, kWarps * 32, 0, s>>>(params);
      break;
    default:
      throw std::invalid_argument("unsupported dtype on CUDA");
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(std::string("CUDA launch failed: ") + cudaGetErrorString(err));
}

namespace flash_fwd_cuda_detail {
// linked into a library, these kernels serve the fork's API for device tensors
[[maybe_unused]] const bool kRegistered = (set_cuda_launcher(&run_mha_fwd_cuda), true);
}  // namespace flash_fwd_cuda_detail

}  // namespace flash
