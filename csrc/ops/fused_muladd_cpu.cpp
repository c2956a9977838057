// keel/csrc/ops/fused_muladd_cpu.cpp
// CPU kernel of keel::fused_muladd (compiled once per ISA, no torch header).
#include "ops/fused_muladd.h"

#include <type_traits>

namespace keel::KEEL_CPU_NS {
namespace {

template <typename T>
void rows_impl(const FusedMulAddParams& p, int64_t begin, int64_t end) {
  T* out = static_cast<T*>(p.out);
  const T* a = static_cast<const T*>(p.a);
  const T* b = static_cast<const T*>(p.b);
  using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;  // math type
  const Acc c = static_cast<Acc>(p.c);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t rest = p.numel - r * p.cols;
    const int64_t n = rest < p.cols ? rest : p.cols;
    T* o = out + r * p.cols;
    const T* ar = a + row_offset(p.a_rows, r);
    const T* br = b + row_offset(p.b_rows, r);
    if (p.a_col == 1 && p.b_col == 1) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) store(o + i, load(ar + i) * load(br + i) + c);
    } else {
      for (int64_t i = 0; i < n; ++i) store(o + i, load(ar + i * p.a_col) * load(br + i * p.b_col) + c);
    }
  }
}

}  // namespace

void fused_muladd_rows(const FusedMulAddParams& p, int64_t begin, int64_t end) {
  if (p.dtype == DType::kFloat64) return rows_impl<double>(p, begin, end);
  dispatch_storage(p.dtype, [&](auto tag) { rows_impl<decltype(tag)>(p, begin, end); });
}

}  // namespace keel::KEEL_CPU_NS
