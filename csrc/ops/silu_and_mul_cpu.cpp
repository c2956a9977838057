// keel/csrc/ops/silu_and_mul_cpu.cpp
// CPU kernel of keel::silu_and_mul (compiled once per ISA, no torch header).
// Matches torch: silu is evaluated in float and rounded to the dtype before the multiply.
#include "ops/silu_and_mul.h"

namespace keel::KEEL_CPU_NS {
namespace {

template <typename T>
void rows_impl(const SiluAndMulParams& p, int64_t begin, int64_t end) {
  T* out = static_cast<T*>(p.out);
  const T* x = static_cast<const T*>(p.x);
  const int64_t d = p.d;
  for (int64_t r = begin; r < end; ++r) {
    const T* xr = x + row_offset(p.x_rows, r);
    T* o = out + r * d;
    const int64_t e = p.x_col;
    if (e == 1) {
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) {
        const float g = load(xr + i);
        store(o + i, round_to<T>(g / (1.0f + exp_f32(-g))) * load(xr + d + i));
      }
    } else {
      for (int64_t i = 0; i < d; ++i) {
        const float g = load(xr + i * e);
        store(o + i, round_to<T>(g / (1.0f + exp_f32(-g))) * load(xr + (d + i) * e));
      }
    }
  }
}

}  // namespace

void silu_and_mul_rows(const SiluAndMulParams& p, int64_t begin, int64_t end) {
  dispatch_storage(p.dtype, [&](auto tag) { rows_impl<decltype(tag)>(p, begin, end); });
}

}  // namespace keel::KEEL_CPU_NS
