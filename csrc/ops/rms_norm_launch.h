// keel/csrc/ops/rms_norm_launch.h
// Shared by the keel::rms_norm and keel::fused_add_rms_norm wrappers: checks of the
// weight, and the launch on the library's device.
#pragma once

#include "ops/rms_norm.h"
#include "stable/check.h"
#include "stable/device.h"
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

inline void launch_rms_norm(const RmsNormParams& p, const Tensor& x) {
  if (p.rows == 0 || p.hidden == 0) return;
  LaunchContext ctx(x);
#ifdef KEEL_CUDA_LIBRARY
  rms_norm_cuda(p, ctx.stream());
#else
  const int64_t grain = p.hidden >= 16384 ? 1 : 16384 / p.hidden;
  parallel_for(p.rows, grain, [&](int64_t b, int64_t e) { cpu::rms_norm_rows(p, b, e); });
#endif
}

}  // namespace keel
