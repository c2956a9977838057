// keel/csrc/ops/reshape_and_cache.h
// Writes each token's key and value rows into a paged KV cache at its slot:
//   cache[slot / block_size, slot % block_size] = key[t]   (slot = slot_mapping[t]; slot < 0: skipped)
#pragma once

#include <cstdint>

#include "ops/cpu_isa.h"
#include "stable/kernel_types.h"

namespace keel {

struct CacheSide {
  const void* src;  // [T, kv_heads, head_size] with strides src_t, src_h, src_d
  int64_t src_t, src_h, src_d;
  void* cache;  // [num_blocks, block_size, kv_heads, head_size] with strides c_b, c_s, c_h, c_d
  int64_t c_b, c_s, c_h, c_d;
};

struct ReshapeAndCacheParams {
  int64_t element_size;  // bytes per element (the op only copies)
  const int64_t* slots;  // [T], stride slot_stride
  int64_t slot_stride;
  CacheSide key;
  CacheSide value;
  int64_t num_tokens;
  int64_t kv_heads;
  int64_t head_size;
  int64_t block_size;
  int64_t capacity;  // num_blocks * block_size: slots must be in [-1, capacity)
};

KEEL_DECLARE_CPU_KERNEL(reshape_and_cache_tokens, ReshapeAndCacheParams)

// Launches on `stream` (a cudaStream_t). Defined in reshape_and_cache.cu.
void reshape_and_cache_cuda(const ReshapeAndCacheParams& p, void* stream);

}  // namespace keel
