// keel/csrc/ops/silu_and_mul_cpu.cpp
// CPU kernel of keel::silu_and_mul (compiled once per ISA, no torch header).
// Matches torch: silu is evaluated in float and rounded to the dtype before the multiply.
#include "ops/silu_and_mul.h"

namespace keel::KEEL_CPU_NS {
namespace {

// One contiguous row: d gate values, then d up values. Each element is computed on its own, so the
// 8-wide and 16-wide builds of this loop give the same bits.
template <typename T>
KEEL_KINLINE void row_contiguous(const T* xr, T* o, int64_t d) {
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) {
    const float g = load(xr + i);
    store(o + i, round_to<T>(g / (1.0f + exp_f32(-g))) * load(xr + d + i));
  }
}

template <typename T>
KEEL_KINLINE void row_strided(const T* xr, T* o, int64_t d, int64_t e) {
  for (int64_t i = 0; i < d; ++i) {
    const float g = load(xr + i * e);
    store(o + i, round_to<T>(g / (1.0f + exp_f32(-g))) * load(xr + (d + i) * e));
  }
}

template <typename T>
KEEL_KINLINE void rows_impl(const SiluAndMulParams& p, int64_t begin, int64_t end) {
  T* out = static_cast<T*>(p.out);
  const T* x = static_cast<const T*>(p.x);
  for (int64_t r = begin; r < end; ++r) {
    if (p.x_col == 1) {
      row_contiguous(x + row_offset(p.x_rows, r), out + r * p.d, p.d);
    } else {
      row_strided(x + row_offset(p.x_rows, r), out + r * p.d, p.d, p.x_col);
    }
  }
}

#if defined(__AVX2__)
template <typename T>
KEEL_AVX512_WIDE void rows_avx512(const SiluAndMulParams& p, int64_t begin, int64_t end) {
  rows_impl<T>(p, begin, end);  // the same loops, compiled 16 wide
}
#endif

}  // namespace

void silu_and_mul_rows(const SiluAndMulParams& p, int64_t begin, int64_t end) {
#if defined(__AVX2__)
  if (p.x_col == 1 && p.dtype != DType::kFloat16 && cpu_has_avx512()) {
    dispatch_storage(p.dtype, [&](auto tag) { rows_avx512<decltype(tag)>(p, begin, end); });
    return;
  }
#endif
  dispatch_storage(p.dtype, [&](auto tag) { rows_impl<decltype(tag)>(p, begin, end); });
}

}  // namespace keel::KEEL_CPU_NS
