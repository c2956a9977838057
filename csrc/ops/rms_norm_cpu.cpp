// keel/csrc/ops/rms_norm_cpu.cpp
// CPU kernel of keel::rms_norm and keel::fused_add_rms_norm (compiled once per ISA,
// no torch header). Rounding follows Hugging Face's LlamaRMSNorm: the residual sum is
// rounded to the storage dtype before the variance, the normalized value is rounded
// before the weight multiply.
#include <cmath>

#include "ops/rms_norm.h"

namespace keel::KEEL_CPU_NS {
namespace {

// Sum of squares of n values read every `col` elements.
template <typename T>
float sum_squares(const T* v, int64_t n, int64_t col) {
  float ss = 0.f;
  if (col == 1) {
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < n; ++i) ss += load(v + i) * load(v + i);
  } else {
    for (int64_t i = 0; i < n; ++i) ss += load(v + i * col) * load(v + i * col);
  }
  return ss;
}

// Two passes over each row and no scratch memory: the first sums squares (the fused op also
// writes residual = x + residual there), the second writes the output from the values that
// pass stored.
template <typename T>
void rows_impl(const RmsNormParams& p, int64_t begin, int64_t end) {
  const int64_t h = p.hidden;
  const T* w = static_cast<const T*>(p.weight);
  for (int64_t r = begin; r < end; ++r) {
    const T* src = static_cast<const T*>(p.x) + row_offset(p.x_rows, r);
    int64_t src_col = p.x_col;
    float ss = 0.f;
    if (p.residual) {
      T* rr = static_cast<T*>(p.residual) + row_offset(p.res_rows, r);
      for (int64_t i = 0; i < h; ++i) {
        T* ri = rr + i * p.res_col;
        store(ri, load(src + i * src_col) + load(ri));
        const float v = load(ri);  // the stored (rounded) sum is what gets normalized
        ss += v * v;
      }
      src = rr;
      src_col = p.res_col;
    } else {
      ss = sum_squares(src, h, src_col);
    }
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(h) + p.eps);
    T* orow = static_cast<T*>(p.out) + row_offset(p.out_rows, r);
    if (p.out_col == 1 && p.w_col == 1 && src_col == 1) {
#pragma omp simd
      for (int64_t i = 0; i < h; ++i) store(orow + i, round_to<T>(load(src + i) * inv) * load(w + i));
    } else {
      for (int64_t i = 0; i < h; ++i) {
        store(orow + i * p.out_col, round_to<T>(load(src + i * src_col) * inv) * load(w + i * p.w_col));
      }
    }
  }
}

}  // namespace

void rms_norm_rows(const RmsNormParams& p, int64_t begin, int64_t end) {
  dispatch_storage(p.dtype, [&](auto tag) { rows_impl<decltype(tag)>(p, begin, end); });
}

}  // namespace keel::KEEL_CPU_NS
