// keel/csrc/stable/overlap.h
// Whether two tensors share memory, for ops that write one of them in place while reading the
// other (x and residual, q and k, the two caches). Exact for views of one buffer with the same
// strides (q and k split from one qkv tensor do not overlap); conservative otherwise.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "stable/check.h"
#include "stable/tensor.h"

namespace keel {
namespace detail {

// Byte range [lo, hi) spanned by `t`'s elements.
inline void byte_extent(const Tensor& t, int64_t* lo, int64_t* hi) {
  int64_t min_off = 0, max_off = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t span = (t.size(d) - 1) * t.stride(d);
    (span < 0 ? min_off : max_off) += span;
  }
  const auto es = static_cast<int64_t>(t.element_size());
  const auto base = static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data_ptr()));
  *lo = base + min_off * es;
  *hi = base + (max_off + 1) * es;
}

struct Dim {
  int64_t stride, size_a, size_b;
};

// Inner extent (in elements, +1) of dims [level, n) for one side.
inline int64_t inner_extent(const std::vector<Dim>& dims, size_t level, bool side_a) {
  int64_t e = 1;
  for (size_t d = level; d < dims.size(); ++d) e += ((side_a ? dims[d].size_a : dims[d].size_b) - 1) * dims[d].stride;
  return e;
}

// Does some element of b (offset `delta` elements from a) coincide with one of a, over dims
// [level, n)? dims sorted by decreasing stride. Returns 1 yes, 0 no, -1 too many cases to tell.
inline int overlap_from(const std::vector<Dim>& dims, size_t level, int64_t delta, int budget) {
  if (level == dims.size()) return delta == 0 ? 1 : 0;
  const Dim& d = dims[level];
  const int64_t ea = inner_extent(dims, level + 1, true);
  const int64_t eb = inner_extent(dims, level + 1, false);
  // k = i - j (a's index minus b's index along this dim) with -eb < delta - k * stride < ea
  auto floor_div = [](int64_t x, int64_t y) { return x >= 0 ? x / y : -((-x + y - 1) / y); };
  const int64_t k_lo = std::max(floor_div(delta - ea, d.stride) + 1, -(d.size_b - 1));
  const int64_t k_hi = std::min(floor_div(delta + eb - 1, d.stride), d.size_a - 1);
  if (k_hi - k_lo + 1 > budget) return -1;
  for (int64_t k = k_lo; k <= k_hi; ++k) {
    const int r = overlap_from(dims, level + 1, delta - k * d.stride, budget);
    if (r != 0) return r;
  }
  return 0;
}

}  // namespace detail

// True when `a` and `b` may share an element's memory.
inline bool may_overlap(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  int64_t alo = 0, ahi = 0, blo = 0, bhi = 0;
  detail::byte_extent(a, &alo, &ahi);
  detail::byte_extent(b, &blo, &bhi);
  if (alo >= bhi || blo >= ahi) return false;  // disjoint ranges (different buffers, or apart)
  const auto es = static_cast<int64_t>(a.element_size());
  const auto pa = static_cast<int64_t>(reinterpret_cast<uintptr_t>(a.data_ptr()));
  const auto pb = static_cast<int64_t>(reinterpret_cast<uintptr_t>(b.data_ptr()));
  if (a.dim() != b.dim() || es != static_cast<int64_t>(b.element_size()) || (pb - pa) % es != 0) return true;
  std::vector<detail::Dim> dims;
  for (int64_t i = 0; i < a.dim(); ++i) {
    const int64_t sa = a.size(i), sb = b.size(i);
    if (sa == 1 && sb == 1) continue;
    const int64_t stride = sa > 1 ? a.stride(i) : b.stride(i);
    if ((sa > 1 && sb > 1 && a.stride(i) != b.stride(i)) || stride <= 0) return true;
    dims.push_back({stride, sa, sb});
  }
  std::sort(dims.begin(), dims.end(), [](const detail::Dim& x, const detail::Dim& y) { return x.stride > y.stride; });
  return detail::overlap_from(dims, 0, (pb - pa) / es, 4) != 0;
}

// `a` (written in place) and `b` must not share memory.
inline void check_no_overlap(const char* op, const char* arg_a, const Tensor& a, const char* arg_b, const Tensor& b) {
  KEEL_CHECK(!may_overlap(a, b), op, ": ", arg_a, " and ", arg_b, " share memory, but ", arg_a,
             " is written in place; pass tensors that do not overlap");
}

}  // namespace keel
