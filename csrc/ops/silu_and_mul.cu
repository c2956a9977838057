// keel/csrc/ops/silu_and_mul.cu
// CUDA launcher of keel::silu_and_mul (no torch header).
#include "ops/cuda_common.cuh"
#include "ops/silu_and_mul.h"

namespace keel {
// a named namespace, not an anonymous one: nvcc names anonymous namespaces after the
// source file's absolute path, so the library's bytes would depend on the build folder
namespace silu_and_mul_detail {

template <typename T>
__global__ void silu_and_mul_kernel(SiluAndMulParams p) {
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {  // a grid stride (cuda::grid_blocks)
    const T* x = static_cast<const T*>(p.x) + row_offset(p.x_rows, r);
    T* out = static_cast<T*>(p.out) + r * p.d;
    int64_t done = 0;  // elements written by the vector loop
    if (p.x_col == 1 && cuda::aligned16(x) && cuda::aligned16(x + p.d) && cuda::aligned16(out)) {
      constexpr int V = cuda::Vec16<T>::n;
      const int64_t nv = p.d / V;
      for (int64_t j = threadIdx.x; j < nv; j += blockDim.x) {
        const cuda::Vec16<T> gv = cuda::load16(x + j * V), uv = cuda::load16(x + p.d + j * V);
        cuda::Vec16<T> ov;
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const float g = cuda::load(&gv.e[e]);
          cuda::store(&ov.e[e], cuda::round_to<T>(g / (1.0f + expf(-g))) * cuda::load(&uv.e[e]));
        }
        cuda::store16(out + j * V, ov);
      }
      done = nv * V;
    }
    for (int64_t i = done + threadIdx.x; i < p.d; i += blockDim.x) {  // the scalar path and the tail
      const float g = cuda::load(x + i * p.x_col);
      const float u = cuda::load(x + (p.d + i) * p.x_col);
      cuda::store(out + i, cuda::round_to<T>(g / (1.0f + expf(-g))) * u);
    }
  }
}

}  // namespace silu_and_mul_detail
using namespace silu_and_mul_detail;  // the launchers below

void silu_and_mul_cuda(const SiluAndMulParams& p, void* stream) {
  cuda::dispatch_float(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t work = p.x_col == 1 ? (p.d + cuda::Vec16<T>::n - 1) / cuda::Vec16<T>::n : p.d;
    const int threads = work >= 1024 ? 1024 : 256;
    silu_and_mul_kernel<T><<<cuda::grid_blocks(p.rows), threads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  });
  cuda::check_launch("keel::silu_and_mul");
}

}  // namespace keel
