// keel/csrc/ops/fused_muladd.cu
// CUDA launcher of keel::fused_muladd (no torch header).
#include "ops/cuda_common.cuh"
#include "ops/fused_muladd.h"

#include <type_traits>

namespace keel {
// a named namespace, not an anonymous one: nvcc names anonymous namespaces after the
// source file's absolute path, so the library's bytes would depend on the build folder
namespace fused_muladd_detail {

template <typename T>
__global__ void fused_muladd_kernel(FusedMulAddParams p) {
  T* out = static_cast<T*>(p.out);
  const T* a = static_cast<const T*>(p.a);
  const T* b = static_cast<const T*>(p.b);
  const bool flat = p.a_col == 1 && p.b_col == 1 && p.a_rows.ndim == 1 && p.b_rows.ndim == 1 &&
                    p.a_rows.strides[0] == p.cols && p.b_rows.strides[0] == p.cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;  // elements written by the vector loop
  if (flat && cuda::aligned16(a) && cuda::aligned16(b) && cuda::aligned16(out)) {
    constexpr int V = cuda::Vec16<T>::n;
    const int64_t nv = p.numel / V;
    for (int64_t j = tid; j < nv; j += stride) {
      const cuda::Vec16<T> av = cuda::load16(a + j * V), bv = cuda::load16(b + j * V);
      cuda::Vec16<T> ov;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        if constexpr (std::is_same_v<T, double>) {
          ov.e[e] = fma(av.e[e], bv.e[e], p.c);
        } else {
          cuda::store(&ov.e[e], fmaf(cuda::load(&av.e[e]), cuda::load(&bv.e[e]), static_cast<float>(p.c)));
        }
      }
      cuda::store16(out + j * V, ov);
    }
    done = nv * V;
  }
  for (int64_t i = done + tid; i < p.numel; i += stride) {  // the scalar path (strided inputs) and the tail
    int64_t ia = i;
    int64_t ib = i;
    if (!flat) {
      const int64_t r = i / p.cols;
      const int64_t c = i - r * p.cols;
      ia = row_offset(p.a_rows, r) + c * p.a_col;
      ib = row_offset(p.b_rows, r) + c * p.b_col;
    }
    if constexpr (std::is_same_v<T, double>) {
      out[i] = fma(a[ia], b[ib], p.c);
    } else {
      cuda::store(out + i, fmaf(cuda::load(a + ia), cuda::load(b + ib), static_cast<float>(p.c)));
    }
  }
}

}  // namespace fused_muladd_detail
using namespace fused_muladd_detail;  // the launchers below

void fused_muladd_cuda(const FusedMulAddParams& p, void* stream) {
  const int threads = 256;
  int64_t blocks = (p.numel + threads - 1) / threads;
  if (blocks > 65535 * 8) blocks = 65535 * 8;
  const auto launch = [&](auto tag) {
    using T = decltype(tag);
    fused_muladd_kernel<T><<<static_cast<unsigned>(blocks), threads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  };
  if (p.dtype == DType::kFloat64) {
    launch(double{});
  } else {
    cuda::dispatch_float(p.dtype, launch);
  }
  cuda::check_launch("keel::fused_muladd");
}

}  // namespace keel
