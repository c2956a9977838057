// keel/csrc/ops/rms_norm_cpu.cpp
// CPU kernel of keel::rms_norm and keel::fused_add_rms_norm (compiled once per ISA,
// no torch header). Rounding follows Hugging Face's LlamaRMSNorm: the residual sum is
// rounded to the storage dtype before the variance, the normalized value is rounded
// before the weight multiply.
#include <cmath>
#include <cstdlib>

#include "ops/rms_norm.h"

namespace keel::KEEL_CPU_NS {
namespace {

template <typename T>
void rows_impl(const RmsNormParams& p, int64_t begin, int64_t end) {
  const T* x = static_cast<const T*>(p.x);
  T* out = static_cast<T*>(p.out);
  T* res = static_cast<T*>(p.residual);
  const T* w = static_cast<const T*>(p.weight);
  const int64_t h = p.hidden;
  // plain malloc: no std:: template code in a per-ISA translation unit (see kernel_types.h)
  float* v = static_cast<float*>(std::malloc(sizeof(float) * static_cast<size_t>(h > 0 ? h : 1)));
  if (!v) return;
  for (int64_t r = begin; r < end; ++r) {
    const T* xr = x + row_offset(p.x_rows, r);
    if (p.x_col == 1) {
#pragma omp simd
      for (int64_t i = 0; i < h; ++i) v[i] = load(xr + i);
    } else {
      for (int64_t i = 0; i < h; ++i) v[i] = load(xr + i * p.x_col);
    }
    if (res) {
      T* rr = res + row_offset(p.res_rows, r);
      for (int64_t i = 0; i < h; ++i) {
        T* ri = rr + i * p.res_col;
        store(ri, v[i] + load(ri));
        v[i] = load(ri);  // the stored (rounded) sum is what gets normalized
      }
    }
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < h; ++i) ss += v[i] * v[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(h) + p.eps);
    T* orow = out + row_offset(p.out_rows, r);
    if (p.out_col == 1 && p.w_col == 1) {
#pragma omp simd
      for (int64_t i = 0; i < h; ++i) store(orow + i, round_to<T>(v[i] * inv) * load(w + i));
    } else {
      for (int64_t i = 0; i < h; ++i) store(orow + i * p.out_col, round_to<T>(v[i] * inv) * load(w + i * p.w_col));
    }
  }
  std::free(v);
}

}  // namespace

void rms_norm_rows(const RmsNormParams& p, int64_t begin, int64_t end) {
  dispatch_storage(p.dtype, [&](auto tag) { rows_impl<decltype(tag)>(p, begin, end); });
}

}  // namespace keel::KEEL_CPU_NS
