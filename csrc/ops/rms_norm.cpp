// keel/csrc/ops/rms_norm.cpp
// keel::rms_norm(Tensor x, Tensor weight, float eps) -> Tensor
// Kernels: rms_norm_cpu.cpp, rms_norm.cu.
#include "ops/rms_norm_launch.h"
#include "stable/alloc.h"
#include "stable/library.h"

namespace keel {

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  RmsNormParams p = rms_norm_params("keel::rms_norm", x, weight, eps);
  Tensor out = empty_like_contiguous(x);
  p.out = out.data_ptr();
  p.out_rows.ndim = 1;
  p.out_rows.sizes[0] = p.rows;
  p.out_rows.strides[0] = p.hidden;
  p.out_col = 1;
  launch_rms_norm(p, x);
  return out;
}

}  // namespace keel

KEEL_LIBRARY_IMPL(m) { m.impl("rms_norm", TORCH_BOX(&keel::rms_norm)); }
