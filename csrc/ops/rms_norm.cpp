// keel/csrc/ops/rms_norm.cpp
// keel::rms_norm(Tensor x, Tensor weight, float eps) -> Tensor
// Kernels: rms_norm_cpu.cpp, rms_norm.cu.
#include "ops/rms_norm_launch.h"
#include "stable/alloc.h"
#include "stable/layout.h"
#include "stable/library.h"

namespace keel {

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  constexpr const char* op = "keel::rms_norm";
  check_library_device(op, "x", x);
  const DType dt = check_float_dtype(op, "x", x);
  check_min_dim(op, "x", x, 1);
  const int64_t hidden = x.size(-1);
  check_norm_weight(op, weight, x, hidden);
  check_eps(op, eps);

  Tensor out = empty_like_contiguous(x);
  RmsNormParams p{};
  p.dtype = dt;
  p.hidden = hidden;
  p.rows = leading_numel(x, x.dim() - 1);
  p.eps = static_cast<float>(eps);
  p.x = x.data_ptr();
  p.x_rows = row_layout(op, "x", x, x.dim() - 1);
  p.x_col = x.stride(-1);
  p.out = out.data_ptr();
  p.out_rows.ndim = 1;
  p.out_rows.sizes[0] = p.rows;
  p.out_rows.strides[0] = hidden;
  p.out_col = 1;
  p.weight = weight.data_ptr();
  p.w_col = weight.stride(0);
  launch_rms_norm(p, x);
  return out;
}

}  // namespace keel

KEEL_LIBRARY_IMPL(m) { m.impl("rms_norm", TORCH_BOX(&keel::rms_norm)); }
