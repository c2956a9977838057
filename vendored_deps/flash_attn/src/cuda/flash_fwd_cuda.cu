// vendored_deps/flash_attn/src/cuda/flash_fwd_cuda.cu
// CUDA forward attention for sm_80+: a straightforward tiled online-softmax kernel (not
// upstream's CUTLASS kernels). One warp per (query row, head); keys in tiles of 32: each lane
// scores one key of the tile, the warp takes the tile's max and sum once, then every lane
// accumulates its slice of the head dim over the tile's values. fp32 accumulation; paged K/V
// through the block table; the same mask rules as the CPU kernels. Three instantiations (dtypes).
// GQA packing: a block serves one kv head (grid.y) and kWarps (query row, query head) pairs of its group, query
// heads fastest, so the warps of a block score the same key rows at the same time and K/V come from memory once
// per block (L1 hits for the other warps) instead of once per query head; at decode (one query row) a block
// holds all query heads of a kv head when the group has at most kWarps heads.
// Grid: x = sequence * blocks of kWarps (row, head) pairs (the batch on x: up to 2^31 - 1 blocks), y = kv head.
// The index data the host does not read (cu_seqlens, seqused_k / cache_seqlens, block ids) is
// checked here: a bad value raises a device-side assert and the access is skipped.
// No split-K on CUDA (num_splits is ignored). Compiled only in keel's build: UNVERIFIED on a GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <stdexcept>
#include <string>

#include "../block_info.h"
#include "../flash_api.h"
#include "flash_fwd_cuda.h"
#include "online_softmax.h"

namespace flash {
// a named namespace, not an anonymous one: nvcc names anonymous namespaces after the
// source file's absolute path, so the library's bytes would depend on the build folder
namespace flash_fwd_cuda_detail {

constexpr int kWarps = 8;   // (query row, query head) pairs per block
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

// NaN-propagating (nan_max), so a NaN score reaches every lane's running max
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(kFull, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// A check of index data: when it fails, a device-side assert (CUDA reports cudaErrorAssert at the next
// synchronizing call, `msg` on stderr; the context is unusable afterwards, as after torch's own index
// asserts), and false, so the caller skips the access. Independent of NDEBUG. (__assert_fail is only
// declared for the device pass when NDEBUG is set, hence the guard.)
__device__ __forceinline__ bool device_check(bool ok, const char* msg) {
#ifdef __CUDA_ARCH__
  if (!ok) __assert_fail(msg, __FILE__, __LINE__, __func__);
#endif
  return ok;
}

// Sequence b's lengths (read from device memory) are consistent with the tensors: every row of q is
// written exactly once and every key row read lies inside K/V. Warp-uniform (depends on b only).
__device__ bool sequence_ok(const Flash_fwd_params& p, int b, const BlockInfo& s) {
  if (p.cu_seqlens_q) {
    const int q0 = p.cu_seqlens_q[b], q1 = p.cu_seqlens_q[b + 1];
    if (!device_check(q0 >= 0 && q0 <= q1 && q1 <= p.total_q,
                      "flash_attn: cu_seqlens_q must be non-decreasing and within q's rows"))
      return false;
    if (!device_check(q1 - q0 <= p.seqlen_q, "flash_attn: a sequence has more queries than max_seqlen_q")) return false;
    if (!device_check(b != 0 || q0 == 0, "flash_attn: cu_seqlens_q[0] must be 0")) return false;
    if (!device_check(b != p.b - 1 || q1 == p.total_q, "flash_attn: cu_seqlens_q[-1] must be total_q")) return false;
  }
  if (!device_check(s.sk >= 0 && s.sk <= p.seqlen_k,
                    "flash_attn: a sequence's keys (seqused_k / cache_seqlens / cu_seqlens_k) exceed max_seqlen_k "
                    "or the cache, or are negative"))
    return false;
  if (p.block_table) {
    return device_check(int64_t(s.sk) <= int64_t(p.max_num_blocks_per_seq) * p.page_block_size,
                        "flash_attn: a sequence has more keys than its block_table row holds");
  }
  if (p.cu_seqlens_k && p.is_seqlens_k_cumulative) {
    const int k0 = p.cu_seqlens_k[b], k1 = p.cu_seqlens_k[b + 1];
    if (!device_check(k0 >= 0 && k0 <= k1 && k1 <= p.total_k,
                      "flash_attn: cu_seqlens_k must be non-decreasing and within k's rows"))
      return false;
    if (!device_check(b != 0 || k0 == 0, "flash_attn: cu_seqlens_k[0] must be 0")) return false;
    return device_check(s.sk <= k1 - k0, "flash_attn: seqused_k exceeds the sequence's keys in cu_seqlens_k");
  }
  return true;
}

// kv_row (block_info.h) after checking the block id it reads; false: skip this key.
__device__ __forceinline__ bool checked_kv_row(const Flash_fwd_params& p, int b, int j, bool is_v, int64_t* row) {
  if (p.block_table) {
    const int blk = p.block_table[b * p.block_table_batch_stride + j / p.page_block_size];
    if (!device_check(blk >= 0 && blk < p.num_blocks, "flash_attn: a block_table entry is outside the paged cache"))
      return false;
  }
  *row = kv_row(p, b, j, is_v);
  return true;
}

template <typename T>
__global__ void __launch_bounds__(kWarps * 32) flash_fwd_kernel(const Flash_fwd_params p) {
  __shared__ float q_s[kWarps][kMaxD];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int ratio = p.h_h_k_ratio;
  const int64_t pairs = int64_t(p.seqlen_q) * ratio;  // (row, head) pairs of one sequence and kv head
  const int64_t mblocks = (pairs + kWarps - 1) / kWarps;
  const int b = int(blockIdx.x / mblocks);
  const int64_t pair = (blockIdx.x % mblocks) * kWarps + warp;
  const int i = int(pair / ratio), h = int(blockIdx.y) * ratio + int(pair % ratio);
  const BlockInfo seq = block_info(p, b);
  if (!sequence_ok(p, b, seq)) return;  // uniform over the block: no barrier follows
  if (i >= seq.sq) return;              // whole warp leaves together; no block-wide barrier follows

  const int hk = blockIdx.y, d = p.d;
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
    int64_t row = 0;
    if (j < hi && checked_kv_row(p, b, j, false, &row)) {
      const T* kr = k + row + int64_t(hk) * p.k_head_stride;
      float dot = 0.f;
      for (int c = 0; c < d; ++c) dot += q_s[warp][c] * to_float(kr[c]);
      s = p.softcap > 0.f ? p.scale_softmax * tanhf(dot * p.softcap) : dot * p.scale_softmax;
    }
    // online_softmax.h: a NaN (or +inf) score makes this row NaN, as on the CPU and in torch's SDPA
    const SoftmaxStep st = softmax_step(m, warp_max(s), s);
    const float alpha = st.alpha, m_new = st.m_new, pj = st.p;
    l = l * alpha + warp_sum(pj);
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) acc[t] *= alpha;
    const int nk = min(32, hi - t0);
    for (int jj = 0; jj < nk; ++jj) {
      const float pb = __shfl_sync(kFull, pj, jj);
      if (!checked_kv_row(p, b, t0 + jj, true, &row)) continue;  // uniform: one key for the whole warp
      const T* vr = v + row + int64_t(hk) * p.v_head_stride;
#pragma unroll
      for (int t = 0; t < kPerLane; ++t) {
        const int c = lane + 32 * t;
        if (c < d) acc[t] += pb * to_float(vr[c]);
      }
    }
    m = m_new;
  }

  const float inv = softmax_final_scale(l);  // no visible key: 0, as upstream; NaN stays NaN
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
  const int64_t mblocks = (int64_t(params.seqlen_q) * params.h_h_k_ratio + kWarps - 1) / kWarps;
  const int64_t blocks_x = int64_t(params.b) * mblocks;
  if (blocks_x == 0 || params.h == 0 || params.h_k == 0) return;  // nothing to compute: a zero grid is an error
  if (blocks_x > INT_MAX || params.h_k > 65535) {
    throw std::invalid_argument("batch_size x ceil(max_seqlen_q x " + std::to_string(params.h_h_k_ratio) + " / " +
                                std::to_string(kWarps) + ") = " + std::to_string(blocks_x) + " and " +
                                std::to_string(params.h_k) +
                                " kv heads exceed one CUDA launch (2^31 - 1 blocks, 65535 kv heads)");
  }
  const dim3 grid(static_cast<unsigned>(blocks_x), static_cast<unsigned>(params.h_k));
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
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("flash_fwd_kernel: CUDA launch failed: ") + cudaGetErrorString(err));
  }
}

namespace flash_fwd_cuda_detail {
// linked into a library, these kernels serve the fork's API for device tensors
[[maybe_unused]] const bool kRegistered = (set_cuda_launcher(&run_mha_fwd_cuda), true);
}  // namespace flash_fwd_cuda_detail

}  // namespace flash
