// keel/csrc/ops/rms_norm_cpu.cpp
// CPU kernel of keel::rms_norm and keel::fused_add_rms_norm (compiled once per ISA,
// no torch header). Rounding follows Hugging Face's LlamaRMSNorm: the residual sum is
// rounded to the storage dtype before the variance, the normalized value is rounded
// before the weight multiply.
#include <cmath>

#include "ops/rms_norm.h"

namespace keel::KEEL_CPU_NS {
namespace {

// Sum of squares of n values read every `col` elements, in 16 partial sums (lane j takes elements j, j + 16,
// j + 32, ...) added at the end in one fixed pairwise tree. The order depends on the row length only: not on
// the row count, the chunk a row falls in, the layout or the build's vector width. Contiguous rows
// vectorize (a single running sum would be a chain of dependent adds).
constexpr int kSumLanes = 16;

template <typename T>
KEEL_KINLINE float sum_squares(const T* v, int64_t n, int64_t col) {
  float acc[kSumLanes] = {};
  int64_t i = 0;
  if (col == 1) {
    for (; i + kSumLanes <= n; i += kSumLanes) {
#pragma omp simd
      for (int j = 0; j < kSumLanes; ++j) {
        const float f = load(v + i + j);
        acc[j] += f * f;
      }
    }
  }
  for (; i < n; ++i) {
    const float f = load(v + i * col);
    acc[i % kSumLanes] += f * f;
  }
  for (int w = kSumLanes / 2; w > 0; w /= 2) {
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  }
  return acc[0];
}

// Per row, no scratch memory: the fused op first stores residual = x + residual; then the sum of
// squares of the values normalized (for the fused op, those stored sums); then the output.
template <typename T>
void rows_impl(const RmsNormParams& p, int64_t begin, int64_t end) {
  const int64_t h = p.hidden;
  const T* w = static_cast<const T*>(p.weight);
  for (int64_t r = begin; r < end; ++r) {
    const T* src = static_cast<const T*>(p.x) + row_offset(p.x_rows, r);
    int64_t src_col = p.x_col;
    if (p.residual) {  // residual = x + residual, stored (rounded): the stored sums are what gets normalized
      T* rr = static_cast<T*>(p.residual) + row_offset(p.res_rows, r);
      if (src_col == 1 && p.res_col == 1) {
#pragma omp simd
        for (int64_t i = 0; i < h; ++i) store(rr + i, load(src + i) + load(rr + i));
      } else {
        for (int64_t i = 0; i < h; ++i) store(rr + i * p.res_col, load(src + i * src_col) + load(rr + i * p.res_col));
      }
      src = rr;
      src_col = p.res_col;
    }
    const float ss = sum_squares(src, h, src_col);
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
