// keel/csrc/ops/reshape_and_cache.cu
// CUDA launcher of keel::reshape_and_cache (no torch header). One block per token.
#include "ops/cuda_common.cuh"
#include "ops/reshape_and_cache.h"

namespace keel {
// a named namespace, not an anonymous one: nvcc names anonymous namespaces after the
// source file's absolute path, so the library's bytes would depend on the build folder
namespace reshape_and_cache_detail {

template <typename T>
__device__ void copy_side(const CacheSide& s, int64_t t, int64_t block, int64_t offset, int64_t heads, int64_t d) {
  const T* src = static_cast<const T*>(s.src) + t * s.src_t;
  T* dst = static_cast<T*>(s.cache) + block * s.c_b + offset * s.c_s;
  // 16-byte copies when each head's row is contiguous and every head starts 16-byte aligned (uniform per block)
  constexpr int V = cuda::Vec16<T>::n;
  if (s.src_d == 1 && s.c_d == 1 && d % V == 0 && s.src_h % V == 0 && s.c_h % V == 0 && cuda::aligned16(src) &&
      cuda::aligned16(dst)) {
    const int64_t per_head = d / V;
    for (int64_t j = threadIdx.x; j < heads * per_head; j += blockDim.x) {
      const int64_t h = j / per_head;
      const int64_t i = (j - h * per_head) * V;
      cuda::store16(dst + h * s.c_h + i, cuda::load16(src + h * s.src_h + i));
    }
    return;
  }
  for (int64_t j = threadIdx.x; j < heads * d; j += blockDim.x) {
    const int64_t h = j / d;
    const int64_t i = j - h * d;
    dst[h * s.c_h + i * s.c_d] = src[h * s.src_h + i * s.src_d];
  }
}

template <typename T>
__global__ void reshape_and_cache_kernel(ReshapeAndCacheParams p) {
  for (int64_t t = blockIdx.x; t < p.num_tokens; t += gridDim.x) {  // a grid stride (cuda::grid_blocks)
    const int64_t slot = p.slots[t * p.slot_stride];
    KEEL_DEVICE_CHECK(slot >= -1 && slot < p.capacity,
                      "keel::reshape_and_cache: a slot_mapping entry is outside the cache's slots (-1 marks padding)");
    if (slot < 0) continue;  // padding
    const int64_t block = slot / p.block_size;
    const int64_t offset = slot - block * p.block_size;
    copy_side<T>(p.key, t, block, offset, p.kv_heads, p.head_size);
    copy_side<T>(p.value, t, block, offset, p.kv_heads, p.head_size);
  }
}

}  // namespace reshape_and_cache_detail
using namespace reshape_and_cache_detail;  // the launchers below

void reshape_and_cache_cuda(const ReshapeAndCacheParams& p, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const unsigned blocks = cuda::grid_blocks(p.num_tokens);
  const int threads = 128;
  switch (p.element_size) {
    case 2:
      reshape_and_cache_kernel<uint16_t><<<blocks, threads, 0, s>>>(p);
      break;
    case 4:
      reshape_and_cache_kernel<uint32_t><<<blocks, threads, 0, s>>>(p);
      break;
    default:
      reshape_and_cache_kernel<uint8_t><<<blocks, threads, 0, s>>>(p);
      break;
  }
  cuda::check_launch("keel::reshape_and_cache");
}

}  // namespace keel
