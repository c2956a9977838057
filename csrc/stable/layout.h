// keel/csrc/stable/layout.h
// Turns a tensor's leading dimensions into a RowLayout (collapsing what can be
// collapsed), so kernels read any strides without a contiguous() copy.
#pragma once

#include <cstdint>

#include "stable/check.h"
#include "stable/kernel_types.h"
#include "stable/tensor.h"

namespace keel {

// Rows over dims [0, lead) of `t`. Size-1 dims are dropped and mergeable dims merged.
inline RowLayout row_layout(const char* op, const char* arg, const Tensor& t, int64_t lead) {
  RowLayout l;
  int64_t sizes[64];
  int64_t strides[64];
  int32_t n = 0;
  KEEL_CHECK(lead <= 64, op, ": ", arg, " has too many dimensions (", t.dim(), ")");
  const auto all_sizes = t.sizes();
  const auto all_strides = t.strides();
  for (int64_t d = 0; d < lead; ++d) {
    const int64_t sz = all_sizes[d];
    const int64_t st = all_strides[d];
    if (sz == 1) continue;
    if (n > 0 && strides[n - 1] == st * sz) {  // previous dim steps exactly over this one
      sizes[n - 1] *= sz;
      strides[n - 1] = st;
      continue;
    }
    sizes[n] = sz;
    strides[n] = st;
    ++n;
  }
  if (n == 0) {
    sizes[0] = 1;
    strides[0] = 0;
    n = 1;
  }
  KEEL_CHECK(n <= RowLayout::kMaxDims, op, ": ", arg, " with shape ", shape_str(t), " has more than ",
             RowLayout::kMaxDims, " non-mergeable leading dimensions");
  l.ndim = n;
  for (int32_t i = 0; i < n; ++i) {
    l.sizes[i] = sizes[i];
    l.strides[i] = strides[i];
  }
  return l;
}

// Product of t.size(d) for d in [0, lead).
inline int64_t leading_numel(const Tensor& t, int64_t lead) {
  int64_t n = 1;
  for (int64_t d = 0; d < lead; ++d) n *= t.size(d);
  return n;
}

// Copies the rows of x [..., K] (any leading strides, its last dim at stride x.stride(-1)) into dst, row r
// at dst + r * dst_row, each element through f (T* -> D): the one gather for wrappers whose kernels read
// their activations contiguous.
template <typename T, typename D, typename F>
inline void copy_rows(const char* op, const char* arg, const Tensor& x, D* dst, int64_t dst_row, const F& f) {
  const RowLayout rows = row_layout(op, arg, x, x.dim() - 1);
  const int64_t m = leading_numel(x, x.dim() - 1);
  const int64_t k = x.size(-1);
  const int64_t col = x.stride(-1);
  const T* xs = static_cast<const T*>(x.data_ptr());
  for (int64_t r = 0; r < m; ++r) {
    const T* xr = xs + row_offset(rows, r);
    D* d = dst + r * dst_row;
    if (col == 1) {
      for (int64_t i = 0; i < k; ++i) d[i] = f(xr + i);
    } else {
      for (int64_t i = 0; i < k; ++i) d[i] = f(xr + i * col);
    }
  }
}

}  // namespace keel
