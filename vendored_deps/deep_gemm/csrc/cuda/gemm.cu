// deep_gemm/csrc/cuda/gemm.cu
// Portable (sm_80+) CUDA path of fp8_gemm_nt / bf16_gemm_nt, a split-K GEMV-style kernel (no tensor cores): one
// thread block per output column n and kRows rows of A; its warps split K by 128-wide blocks (warp w takes
// blocks w, w + splits, ...), each lane reads 4 consecutive K elements (one 4-byte load of e4m3 or one 8-byte
// load of bf16 when aligned, element loads otherwise and at the tail), so one pass of a warp covers one K block,
// whose scale sfa[m, kb] * sfb[n / gran_n, kb] is applied to the lane's partial sum. The B chunk a lane loads
// serves all kRows rows (decode-shaped GEMMs, M <= kRows, read B once). e4m3 is decoded by the hardware
// conversion (cuda_fp8.h, e4m3x2 -> f16x2: exact, NaN stays NaN), bf16 by a shift. Per row: a shuffle reduction
// per warp, then the warps' sums in shared memory, added in warp order by one thread: D = C + A @ B.T.
// UNVERIFIED: compiled and linked here, never run on a GPU.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "csrc/cuda/launch.hpp"
#include "csrc/utils/exception.hpp"

namespace deep_gemm::cuda {
// a named namespace, not an anonymous one: nvcc names anonymous namespaces after the
// source file's absolute path, so the library's bytes would depend on the build folder
namespace gemm_detail {

constexpr int kMaxSplit = 8;  // warps per block: K splits
constexpr int kRows = 4;      // rows of A per block, sharing each B chunk

// one e4m3 byte -> float, by the hardware conversion (exact: every e4m3 value is a half)
__device__ __forceinline__ float e4m3_to_float(uint8_t v) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(v), __NV_E4M3)));
}

// two e4m3 bytes (low byte first) -> two floats
__device__ __forceinline__ float2 e4m3x2_to_float2(uint16_t v) {
  return __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v), __NV_E4M3)));
}

__device__ __forceinline__ float bf16_to_float(uint16_t v) { return __uint_as_float(static_cast<uint32_t>(v) << 16); }

__device__ __forceinline__ uint16_t float_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// elements k .. k + 3 of a row (e4m3 or bf16) as floats; 0 past the row's end (k_end). `vec`: the row and k are
// aligned for one 4-byte (e4m3) or 8-byte (bf16) load (checked on the host: pointers and leading dims).
__device__ __forceinline__ void load4(const void* base, int64_t ld, bool fp8, bool vec, int64_t row, int64_t k,
                                      int64_t k_end, float (&out)[4]) {
  if (fp8) {
    const uint8_t* p = static_cast<const uint8_t*>(base) + row * ld + k;
    if (vec && k + 4 <= k_end) {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(p);
      const float2 lo = e4m3x2_to_float2(static_cast<uint16_t>(w & 0xffffu));
      const float2 hi = e4m3x2_to_float2(static_cast<uint16_t>(w >> 16));
      out[0] = lo.x, out[1] = lo.y, out[2] = hi.x, out[3] = hi.y;
      return;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = k + i < k_end ? e4m3_to_float(p[i]) : 0.0f;
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(base) + row * ld + k;
    if (vec && k + 4 <= k_end) {
      const uint2 w = *reinterpret_cast<const uint2*>(p);
      out[0] = __uint_as_float(w.x << 16), out[1] = __uint_as_float(w.x & 0xffff0000u);
      out[2] = __uint_as_float(w.y << 16), out[3] = __uint_as_float(w.y & 0xffff0000u);
      return;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = k + i < k_end ? bf16_to_float(p[i]) : 0.0f;
  }
}

__global__ void __launch_bounds__(kMaxSplit * 32) gemm_nt_splitk_kernel(const GemmArgs g, bool vec) {
  __shared__ float warp_sums[kMaxSplit][kRows];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, splits = blockDim.x / 32;
  const int64_t n = blockIdx.x;
  const int64_t kblocks = (g.k + 127) / 128;
  for (int64_t m0 = static_cast<int64_t>(blockIdx.y) * kRows; m0 < g.m; m0 += static_cast<int64_t>(gridDim.y) * kRows) {
    const int rows = g.m - m0 < kRows ? static_cast<int>(g.m - m0) : kRows;  // uniform over the block
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
    for (int64_t kb = warp; kb < kblocks; kb += splits) {
      const int64_t k = kb * 128 + lane * 4;
      float b4[4];
      load4(g.b, g.ldb, g.fp8, vec, n, k, g.k, b4);
      const float sb = g.fp8 ? g.sfb[(n / g.sfb_gran_n) * g.sfb_s0 + kb * g.sfb_s1] : 1.0f;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r >= rows) break;
        float a4[4];
        load4(g.a, g.lda, g.fp8, vec, m0 + r, k, g.k, a4);
        float part = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) part += a4[i] * b4[i];
        if (g.fp8) part *= g.sfa[(m0 + r) * g.sfa_s0 + kb * g.sfa_s1] * sb;
        acc[r] += part;
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float v = acc[r];
      for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0) warp_sums[warp][r] = v;
    }
    __syncthreads();
    if (threadIdx.x < rows) {
      const int64_t m = m0 + threadIdx.x;
      float sum = 0.0f;
      for (int w = 0; w < splits; ++w) sum += warp_sums[w][threadIdx.x];  // in warp order: deterministic
      if (g.c) {
        sum += g.c_fp32 ? static_cast<const float*>(g.c)[m * g.ldc0 + n * g.ldc1]
                        : bf16_to_float(static_cast<const uint16_t*>(g.c)[m * g.ldc0 + n * g.ldc1]);
      }
      if (g.d_fp32) {
        static_cast<float*>(g.d)[m * g.ldd0 + n * g.ldd1] = sum;
      } else {
        static_cast<uint16_t*>(g.d)[m * g.ldd0 + n * g.ldd1] = float_to_bf16(sum);
      }
    }
    __syncthreads();  // warp_sums is rewritten by the next rows
  }
}

void launch_gemm_nt(const GemmArgs& g, void* stream) {
  if (g.m == 0 || g.n == 0) return;
  DG_HOST_ASSERT(g.n <= 2147483647, g.op, ": n = ", g.n, " exceeds one CUDA launch (2^31 - 1 blocks)");
  const int64_t kblocks = (g.k + 127) / 128;
  const int splits = kblocks < kMaxSplit ? (kblocks > 0 ? static_cast<int>(kblocks) : 1) : kMaxSplit;
  const int64_t row_groups = (g.m + kRows - 1) / kRows;
  const dim3 grid(static_cast<unsigned>(g.n), static_cast<unsigned>(row_groups < 65535 ? row_groups : 65535));
  // the vector loads: every row start and every lane's k offset (a multiple of 4 elements) aligned
  const int64_t bytes = g.fp8 ? 4 : 8;
  const bool vec = reinterpret_cast<uintptr_t>(g.a) % bytes == 0 && reinterpret_cast<uintptr_t>(g.b) % bytes == 0 &&
                   g.lda % 4 == 0 && g.ldb % 4 == 0;
  gemm_nt_splitk_kernel<<<grid, splits * 32, 0, static_cast<cudaStream_t>(stream)>>>(g, vec);
  const cudaError_t err = cudaGetLastError();
  DG_HOST_ASSERT(err == cudaSuccess, g.op, ": CUDA launch failed: ", cudaGetErrorString(err));
}

[[maybe_unused]] const bool registered = register_gemm_launcher(&launch_gemm_nt);

}  // namespace gemm_detail
using namespace gemm_detail;  // the launchers below
}  // namespace deep_gemm::cuda
