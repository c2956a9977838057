// keel/csrc/ops/rotary_embedding.cu
// CUDA launcher of keel::rotary_embedding (no torch header). One block per token.
#include "ops/cuda_common.cuh"
#include "ops/rotary_embedding.h"

namespace keel {
// a named namespace, not an anonymous one: nvcc names anonymous namespaces after the
// source file's absolute path, so the library's bytes would depend on the build folder
namespace rotary_embedding_detail {

template <typename T, typename C>
__device__ void rotate(const RotaryTensor& t, int64_t token, const C* cos, const C* sin, int64_t cs, int64_t half,
                       bool neox) {
  T* base = static_cast<T*>(t.data) + row_offset(t.tokens, token);
  for (int64_t j = threadIdx.x; j < t.num_heads * half; j += blockDim.x) {
    const int64_t h = j / half;
    const int64_t i = j - h * half;
    T* x = base + h * t.head_stride;
    const int64_t i1 = neox ? i : 2 * i;
    const int64_t i2 = neox ? i + half : 2 * i + 1;
    const float c = cuda::load(cos + i * cs);
    const float s = cuda::load(sin + i * cs);
    const float x1 = cuda::load(x + i1 * t.elem_stride);
    const float x2 = cuda::load(x + i2 * t.elem_stride);
    cuda::store(x + i1 * t.elem_stride, x1 * c - x2 * s);
    cuda::store(x + i2 * t.elem_stride, x2 * c + x1 * s);
  }
}

template <typename T, typename C>
__global__ void rotary_kernel(RotaryParams p) {
  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {  // a grid stride (cuda::grid_blocks)
    const int64_t pos = p.positions[row_offset(p.pos_rows, t)];
    KEEL_DEVICE_CHECK(pos >= 0 && pos < p.max_position,
                      "keel::rotary_embedding: a position is outside cos_sin_cache's rows");
    const int64_t half = p.rot_dim / 2;
    const C* cos = static_cast<const C*>(p.cache) + pos * p.cache_row_stride;
    const C* sin = cos + half * p.cache_col_stride;
    rotate<T, C>(p.q, t, cos, sin, p.cache_col_stride, half, p.is_neox);
    rotate<T, C>(p.k, t, cos, sin, p.cache_col_stride, half, p.is_neox);
  }
}

}  // namespace rotary_embedding_detail
using namespace rotary_embedding_detail;  // the launchers below

void rotary_embedding_cuda(const RotaryParams& p, void* stream) {
  const int threads = 128;
  cuda::dispatch_float(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    auto s = static_cast<cudaStream_t>(stream);
    const unsigned blocks = cuda::grid_blocks(p.num_tokens);
    if (p.cache_dtype == DType::kFloat32) {
      rotary_kernel<T, float><<<blocks, threads, 0, s>>>(p);
    } else {
      rotary_kernel<T, T><<<blocks, threads, 0, s>>>(p);
    }
  });
  cuda::check_launch("keel::rotary_embedding");
}

}  // namespace keel
