// keel/csrc/ops/rms_norm.cu
// CUDA launcher of keel::rms_norm and keel::fused_add_rms_norm (no torch header).
// One block per row; same rounding order as the CPU kernel.
#include "ops/cuda_common.cuh"
#include "ops/rms_norm.h"

namespace keel {
// a named namespace, not an anonymous one: nvcc names anonymous namespaces after the
// source file's absolute path, so the library's bytes would depend on the build folder
namespace rms_norm_detail {

template <typename T>
__device__ __forceinline__ void rms_norm_row(const RmsNormParams& p, int64_t r) {
  const T* x = static_cast<const T*>(p.x) + row_offset(p.x_rows, r);
  T* out = static_cast<T*>(p.out) + row_offset(p.out_rows, r);
  T* res = p.residual ? static_cast<T*>(p.residual) + row_offset(p.res_rows, r) : nullptr;
  const T* w = static_cast<const T*>(p.weight);
  // 16-byte vectors when every column is contiguous and every row start aligned (uniform over the block); the
  // scalar loops below take the rest of the row (all of it otherwise). Both passes split the row alike, so each
  // thread re-reads only its own residual writes.
  constexpr int V = cuda::Vec16<T>::n;
  const bool vec = p.x_col == 1 && p.out_col == 1 && p.w_col == 1 && (!res || p.res_col == 1) && cuda::aligned16(x) &&
                   cuda::aligned16(out) && cuda::aligned16(w) && (!res || cuda::aligned16(res));
  const int64_t nv = vec ? p.hidden / V : 0;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < nv; j += blockDim.x) {
    cuda::Vec16<T> xv = cuda::load16(x + j * V);
    if (res) {
      cuda::Vec16<T> rv = cuda::load16(res + j * V);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float v = cuda::round_to<T>(cuda::load(&xv.e[e]) + cuda::load(&rv.e[e]));
        cuda::store(&rv.e[e], v);
        ss += v * v;
      }
      cuda::store16(res + j * V, rv);
    } else {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float v = cuda::load(&xv.e[e]);
        ss += v * v;
      }
    }
  }
  for (int64_t i = nv * V + threadIdx.x; i < p.hidden; i += blockDim.x) {
    float v = cuda::load(x + i * p.x_col);
    if (res) {
      T* ri = res + i * p.res_col;
      v = cuda::round_to<T>(v + cuda::load(ri));
      cuda::store(ri, v);
    }
    ss += v * v;
  }
  const float inv = rsqrtf(cuda::block_sum(ss) / static_cast<float>(p.hidden) + p.eps);
  for (int64_t j = threadIdx.x; j < nv; j += blockDim.x) {
    // the fused op re-reads its own (already rounded) residual write
    const cuda::Vec16<T> xv = cuda::load16((res ? res : x) + j * V), wv = cuda::load16(w + j * V);
    cuda::Vec16<T> ov;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      cuda::store(&ov.e[e], cuda::round_to<T>(cuda::load(&xv.e[e]) * inv) * cuda::load(&wv.e[e]));
    }
    cuda::store16(out + j * V, ov);
  }
  for (int64_t i = nv * V + threadIdx.x; i < p.hidden; i += blockDim.x) {
    const float v = res ? cuda::load(res + i * p.res_col) : cuda::load(x + i * p.x_col);
    cuda::store(out + i * p.out_col, cuda::round_to<T>(v * inv) * cuda::load(w + i * p.w_col));
  }
}

template <typename T>
__global__ void rms_norm_kernel(RmsNormParams p) {
  // a grid stride over rows (cuda::grid_blocks); r is uniform over the block, so block_sum's barriers are too
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) rms_norm_row<T>(p, r);
}

}  // namespace rms_norm_detail
using namespace rms_norm_detail;  // the launchers below

void rms_norm_cuda(const RmsNormParams& p, void* stream) {
  cuda::dispatch_float(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    // threads for the elements each row takes in 16-byte vectors (contiguous rows), or one by one
    const int64_t work = p.x_col == 1 ? (p.hidden + cuda::Vec16<T>::n - 1) / cuda::Vec16<T>::n : p.hidden;
    const int threads = work >= 1024 ? 1024 : (work >= 256 ? 256 : 128);
    rms_norm_kernel<T><<<cuda::grid_blocks(p.rows), threads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  });
  cuda::check_launch(p.residual ? "keel::fused_add_rms_norm" : "keel::rms_norm");
}

}  // namespace keel
