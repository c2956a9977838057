// keel/csrc/ops/rotary_embedding_cpu.cpp
// CPU kernel of keel::rotary_embedding (compiled once per ISA, no torch header).
#include <type_traits>

#include "ops/rotary_embedding.h"

namespace keel::KEEL_CPU_NS {
namespace {

template <typename T, typename C>
void rotate_heads(const RotaryTensor& t, int64_t token, const C* cos, const C* sin, int64_t cs, int64_t half,
                  bool neox) {
  T* base = static_cast<T*>(t.data) + row_offset(t.tokens, token);
  const int64_t e = t.elem_stride;
  for (int64_t h = 0; h < t.num_heads; ++h) {
    T* x = base + h * t.head_stride;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t i1 = neox ? i : 2 * i;
      const int64_t i2 = neox ? i + half : 2 * i + 1;
      const float c = load(cos + i * cs);
      const float s = load(sin + i * cs);
      const float x1 = load(x + i1 * e);
      const float x2 = load(x + i2 * e);
      store(x + i1 * e, x1 * c - x2 * s);
      store(x + i2 * e, x2 * c + x1 * s);
    }
  }
}

// A cos / sin row of a 16-bit (or strided) cache, up to this many pairs, is first copied to float (exact), so
// the rotation reads contiguous float: read in place, a bf16 cache (the model's) cost several times an fp32 one.
constexpr int64_t kStagedPairs = 256;

template <typename T, typename C>
void tokens_impl(const RotaryParams& p, int64_t begin, int64_t end) {
  const C* cache = static_cast<const C*>(p.cache);
  const int64_t half = p.rot_dim / 2;
  const int64_t cs = p.cache_col_stride;
  float cos_f[kStagedPairs], sin_f[kStagedPairs];
  for (int64_t t = begin; t < end; ++t) {
    const int64_t pos = p.positions[row_offset(p.pos_rows, t)];
    const C* cos = cache + pos * p.cache_row_stride;
    const C* sin = cos + half * cs;
    if (half <= kStagedPairs && !(std::is_same_v<C, float> && cs == 1)) {
      for (int64_t i = 0; i < half; ++i) {
        cos_f[i] = load(cos + i * cs);
        sin_f[i] = load(sin + i * cs);
      }
      rotate_heads<T, float>(p.q, t, cos_f, sin_f, 1, half, p.is_neox);
      rotate_heads<T, float>(p.k, t, cos_f, sin_f, 1, half, p.is_neox);
    } else {
      rotate_heads<T, C>(p.q, t, cos, sin, cs, half, p.is_neox);
      rotate_heads<T, C>(p.k, t, cos, sin, cs, half, p.is_neox);
    }
  }
}

template <typename T>
void with_cache(const RotaryParams& p, int64_t begin, int64_t end) {
  if (p.cache_dtype == DType::kFloat32) return tokens_impl<T, float>(p, begin, end);
  return tokens_impl<T, T>(p, begin, end);
}

}  // namespace

void rotary_embedding_tokens(const RotaryParams& p, int64_t begin, int64_t end) {
  dispatch_storage(p.dtype, [&](auto tag) { with_cache<decltype(tag)>(p, begin, end); });
}

}  // namespace keel::KEEL_CPU_NS
