// keel/csrc/ops/reshape_and_cache_cpu.cpp
// CPU kernel of keel::reshape_and_cache (compiled once per ISA, no torch header).
#include <cstring>

#include "ops/reshape_and_cache.h"

namespace keel::KEEL_CPU_NS {
namespace {

template <typename T>
void copy_token(const CacheSide& s, int64_t t, int64_t block, int64_t offset, int64_t heads, int64_t d) {
  const T* src = static_cast<const T*>(s.src) + t * s.src_t;
  T* dst = static_cast<T*>(s.cache) + block * s.c_b + offset * s.c_s;
  for (int64_t h = 0; h < heads; ++h) {
    const T* sh = src + h * s.src_h;
    T* dh = dst + h * s.c_h;
    if (s.src_d == 1 && s.c_d == 1) {
      std::memcpy(dh, sh, static_cast<size_t>(d) * sizeof(T));
    } else {
      for (int64_t i = 0; i < d; ++i) dh[i * s.c_d] = sh[i * s.src_d];
    }
  }
}

template <typename T>
void tokens_impl(const ReshapeAndCacheParams& p, int64_t begin, int64_t end) {
  for (int64_t t = begin; t < end; ++t) {
    const int64_t slot = p.slots[t * p.slot_stride];
    if (slot < 0) continue;  // padding token
    const int64_t block = slot / p.block_size;
    const int64_t offset = slot - block * p.block_size;
    copy_token<T>(p.key, t, block, offset, p.kv_heads, p.head_size);
    copy_token<T>(p.value, t, block, offset, p.kv_heads, p.head_size);
  }
}

}  // namespace

void reshape_and_cache_tokens(const ReshapeAndCacheParams& p, int64_t begin, int64_t end) {
  switch (p.element_size) {
    case 2:
      return tokens_impl<uint16_t>(p, begin, end);
    case 4:
      return tokens_impl<uint32_t>(p, begin, end);
    default:
      return tokens_impl<uint8_t>(p, begin, end);
  }
}

}  // namespace keel::KEEL_CPU_NS
