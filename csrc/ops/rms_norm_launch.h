// keel/csrc/ops/rms_norm_launch.h
// Shared by the keel::rms_norm and keel::fused_add_rms_norm wrappers: checks of the
// weight, and the launch on the library's device.
#pragma once

#include "ops/rms_norm.h"
#include "stable/check.h"
#include "stable/device.h"
#include "stable/layout.h"
#include "stable/parallel.h"

namespace keel {

// weight must be 1-D with `hidden` elements, dtype and device of x.
inline void check_norm_weight(const char* op, const Tensor& weight, const Tensor& x, int64_t hidden) {
  check_same_device(op, "weight", weight, "x", x);
  check_same_dtype(op, "weight", weight, "x", x);
  KEEL_CHECK(weight.dim() == 1 && weight.size(0) == hidden, op, ": weight must be 1-D with ", hidden,
             " elements (the last dim of x), got shape ", shape_str(weight));
}

inline void check_eps(const char* op, double eps) {
  KEEL_CHECK(eps >= 0.0 && eps == eps, op, ": eps must be a non-negative number, got ", eps);
}

// Checks x, weight and eps, and fills the parameters both norm ops share (x is read in place).
inline RmsNormParams rms_norm_params(const char* op, const Tensor& x, const Tensor& weight, double eps) {
  check_library_device(op, "x", x);
  RmsNormParams p{};
  p.dtype = check_float_dtype(op, "x", x);
  check_min_dim(op, "x", x, 1);
  p.hidden = x.size(-1);
  check_norm_weight(op, weight, x, p.hidden);
  check_eps(op, eps);
  p.rows = leading_numel(x, x.dim() - 1);
  p.eps = static_cast<float>(eps);
  p.x = x.data_ptr();
  p.x_rows = row_layout(op, "x", x, x.dim() - 1);
  p.x_col = x.stride(-1);
  p.weight = weight.data_ptr();
  p.w_col = weight.stride(0);
  return p;
}

inline void launch_rms_norm(const RmsNormParams& p, const Tensor& x) {
  if (p.rows == 0 || p.hidden == 0) return;
  LaunchContext ctx(x);
#ifdef KEEL_CUDA_LIBRARY
  rms_norm_cuda(p, ctx.stream());
#else
  parallel_for(p.rows, grain_for(p.hidden), [&](int64_t b, int64_t e) { cpu::rms_norm_rows(p, b, e); });
#endif
}

}  // namespace keel
