// keel/csrc/ops/fused_add_rms_norm.cpp
// keel::fused_add_rms_norm(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps) -> ()
//   residual = x + residual; x = rms_norm(residual, weight, eps)   (in place)
// Kernels: the fused path of rms_norm_cpu.cpp and rms_norm.cu.
#include "ops/rms_norm_launch.h"
#include "stable/dispatcher.h"
#include "stable/layout.h"
#include "stable/library.h"
#include "stable/overlap.h"

namespace keel {

void fused_add_rms_norm(Tensor x, Tensor residual, const Tensor& weight, double eps) {
  constexpr const char* op = "keel::fused_add_rms_norm";
  RmsNormParams p = rms_norm_params(op, x, weight, eps);
  check_same_device(op, "residual", residual, "x", x);
  check_same_dtype(op, "residual", residual, "x", x);
  check_same_shape(op, "residual", residual, "x", x);
  KEEL_CHECK(internal_overlap(x) != InternalOverlap::kYes, op,
             ": x is written in place but has overlapping elements (e.g. from expand); pass a clone");
  KEEL_CHECK(internal_overlap(residual) != InternalOverlap::kYes, op,
             ": residual is written in place but has overlapping elements (e.g. from expand); pass a clone");
  check_no_overlap(op, "x", x, "residual", residual);
  check_no_overlap(op, "x", x, "weight", weight);
  check_no_overlap(op, "residual", residual, "weight", weight);
  p.out = x.data_ptr();
  p.out_rows = p.x_rows;
  p.out_col = p.x_col;
  p.residual = residual.data_ptr();
  p.res_rows = row_layout(op, "residual", residual, residual.dim() - 1);
  p.res_col = residual.stride(-1);
  launch_rms_norm(p, x);
}

}  // namespace keel

KEEL_LIBRARY_IMPL(m) { m.impl("fused_add_rms_norm", TORCH_BOX(&keel::fused_add_rms_norm)); }
