// keel/csrc/ops/reshape_and_cache.cpp
// keel::reshape_and_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache,
//                         Tensor slot_mapping) -> ()
// key/value: [T, kv_heads, head_size]; caches: [num_blocks, block_size, kv_heads, head_size];
// slot_mapping: int64 [T], -1 marks a padding token (not written).
// Kernels: reshape_and_cache_cpu.cpp, reshape_and_cache.cu.
#include "ops/reshape_and_cache.h"
#include "ops/layer_common.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "stable/check.h"
#include "stable/device.h"
#include "stable/dispatcher.h"
#include "stable/library.h"
#include "stable/overlap.h"
#include "stable/parallel.h"

namespace keel {
namespace {

constexpr const char* kOp = "keel::reshape_and_cache";

CacheSide describe(const Tensor& src, const Tensor& cache) {
  CacheSide s{};
  s.src = src.data_ptr();
  s.src_t = src.stride(0);
  s.src_h = src.stride(1);
  s.src_d = src.stride(2);
  s.cache = cache.data_ptr();
  s.c_b = cache.stride(0);
  s.c_s = cache.stride(1);
  s.c_h = cache.stride(2);
  s.c_d = cache.stride(3);
  return s;
}

}  // namespace

#ifndef KEEL_CUDA_LIBRARY
// Every slot in [-1, capacity), and no slot twice (two tokens writing one cache row would race
// between threads; which one wins is not defined). Increasing slots, the usual case, need no sort.
void check_cache_slots(const char* op, const ReshapeAndCacheParams& p, int64_t capacity) {
  bool increasing = true;
  int64_t last = -1;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int64_t slot = p.slots[t * p.slot_stride];
    KEEL_CHECK(slot >= -1 && slot < capacity, op, ": slot_mapping[", t, "]=", slot, " is outside the cache's ",
               capacity, " slots (-1 marks padding)");
    if (slot < 0) continue;
    increasing = increasing && slot > last;
    last = slot;
  }
  if (increasing) return;
  std::vector<std::pair<int64_t, int64_t>> seen;  // (slot, token)
  seen.reserve(static_cast<size_t>(p.num_tokens));
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int64_t slot = p.slots[t * p.slot_stride];
    if (slot >= 0) seen.emplace_back(slot, t);
  }
  std::sort(seen.begin(), seen.end());
  for (size_t i = 1; i < seen.size(); ++i) {
    KEEL_CHECK(seen[i].first != seen[i - 1].first, op, ": slot_mapping[", seen[i - 1].second, "] and slot_mapping[",
               seen[i].second, "] are both ", seen[i].first, "; each cache slot may be written by one token only");
  }
}
#endif

void reshape_and_cache(const Tensor& key, const Tensor& value, Tensor key_cache, Tensor value_cache,
                       const Tensor& slot_mapping) {
  check_library_device(kOp, "key", key);
  check_same_device(kOp, "value", value, "key", key);
  check_same_device(kOp, "key_cache", key_cache, "key", key);
  check_same_device(kOp, "value_cache", value_cache, "key", key);
  check_same_device(kOp, "slot_mapping", slot_mapping, "key", key);
  check_float_dtype(kOp, "key", key);
  check_same_dtype(kOp, "value", value, "key", key);
  check_same_dtype(kOp, "key_cache", key_cache, "key", key);
  check_same_dtype(kOp, "value_cache", value_cache, "key", key);
  check_dim(kOp, "key", key, 3);
  check_same_shape(kOp, "value", value, "key", key);
  check_dim(kOp, "key_cache", key_cache, 4);
  check_same_shape(kOp, "value_cache", value_cache, "key_cache", key_cache);
  KEEL_CHECK(key_cache.size(2) == key.size(1) && key_cache.size(3) == key.size(2), kOp,
             ": key_cache must be [num_blocks, block_size, ", key.size(1), ", ", key.size(2), "] to hold key ",
             shape_str(key), ", got ", shape_str(key_cache));
  KEEL_CHECK(key_cache.size(1) > 0, kOp, ": key_cache block_size must be positive, got shape ", shape_str(key_cache));
  KEEL_CHECK(dtype_code(slot_mapping) == shim_codes().int64, kOp, ": slot_mapping must be int64, got ",
             scalar_type_name(slot_mapping.scalar_type()));
  KEEL_CHECK(slot_mapping.dim() == 1 && slot_mapping.size(0) == key.size(0), kOp,
             ": slot_mapping must be 1-D with one slot per token (", key.size(0), "), got shape ",
             shape_str(slot_mapping));
  KEEL_CHECK(internal_overlap(key_cache) != InternalOverlap::kYes, kOp,
             ": key_cache is written in place but has overlapping elements");
  KEEL_CHECK(internal_overlap(value_cache) != InternalOverlap::kYes, kOp,
             ": value_cache is written in place but has overlapping elements");

  check_no_overlap(kOp, "key_cache", key_cache, "value_cache", value_cache);
  check_no_overlap(kOp, "key_cache", key_cache, "key", key);
  check_no_overlap(kOp, "key_cache", key_cache, "value", value);
  check_no_overlap(kOp, "value_cache", value_cache, "key", key);
  check_no_overlap(kOp, "value_cache", value_cache, "value", value);
  ReshapeAndCacheParams p{};
  p.element_size = static_cast<int64_t>(key.element_size());
  p.slots = static_cast<const int64_t*>(slot_mapping.data_ptr());
  p.slot_stride = slot_mapping.stride(0);
  p.key = describe(key, key_cache);
  p.value = describe(value, value_cache);
  p.num_tokens = key.size(0);
  p.kv_heads = key.size(1);
  p.head_size = key.size(2);
  p.block_size = key_cache.size(1);
  p.capacity = key_cache.size(0) * p.block_size;
  if (p.num_tokens == 0) return;

  LaunchContext ctx(key);
#ifdef KEEL_CUDA_LIBRARY
  // Slots stay on the device: the kernel checks their range (a device-side assert, no host
  // sync). Duplicate slots are not detected on CUDA (which token's row lands is undefined).
  reshape_and_cache_cuda(p, ctx.stream());
#else
  check_cache_slots(kOp, p, p.capacity);
  parallel_for(p.num_tokens, grain_for(2 * p.kv_heads * p.head_size, 32768),
               [&](int64_t b, int64_t e) { cpu::reshape_and_cache_tokens(p, b, e); });
#endif
}

}  // namespace keel

KEEL_LIBRARY_IMPL(m) { m.impl("reshape_and_cache", TORCH_BOX(&keel::reshape_and_cache)); }
