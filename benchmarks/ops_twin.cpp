// keel/benchmarks/ops_twin.cpp -- FOR THE BENCHMARK ONLY, never part of the wheel.
// An unstable-ABI twin (TORCH_LIBRARY, at::Tensor) of keel::fused_muladd and keel::rms_norm that
// runs the very same CPU kernels (csrc/ops/*_cpu.cpp, compiled beside it by benchmarks/ops.py)
// after the same argument checks, so that the per-call difference to keel is what the stable ABI
// costs: StableIValue boxing, shim calls instead of inline accessors, the stable dispatcher entry.
// Record: docs/measurements/2026-12-01-ops-overhead.md (`python benchmarks/ops.py --twin-only`).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "ops/fused_muladd.h"
#include "ops/rms_norm.h"

namespace {

using keel::DType;

DType float_dtype(const char* op, const char* arg, const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return DType::kFloat32;
    case at::kBFloat16:
      return DType::kBFloat16;
    case at::kHalf:
      return DType::kFloat16;
    case at::kDouble:
      return DType::kFloat64;
    default:
      TORCH_CHECK(false, op, ": ", arg, " must be float32, bfloat16 or float16, got ", t.scalar_type());
  }
}

keel::RowLayout rows_of(const at::Tensor& t, int64_t lead) {
  keel::RowLayout l;
  int32_t n = 0;
  for (int64_t d = 0; d < lead; ++d) {
    const int64_t sz = t.size(d), st = t.stride(d);
    if (sz == 1) continue;
    if (n > 0 && l.strides[n - 1] == st * sz) {
      l.sizes[n - 1] *= sz;
      l.strides[n - 1] = st;
      continue;
    }
    TORCH_CHECK(n < keel::RowLayout::kMaxDims, "too many leading dims");
    l.sizes[n] = sz;
    l.strides[n] = st;
    ++n;
  }
  if (n == 0) {
    l.sizes[0] = 1;
    l.strides[0] = 0;
    n = 1;
  }
  l.ndim = n;
  return l;
}

at::Tensor fused_muladd(const at::Tensor& a, const at::Tensor& b, double c) {
  constexpr const char* op = "keel_twin::fused_muladd";
  TORCH_CHECK(a.device().is_cpu(), op, ": a must be a CPU tensor");
  TORCH_CHECK(b.device() == a.device(), op, ": b must be on the device of a");
  const DType dt = float_dtype(op, "a", a);
  TORCH_CHECK(b.scalar_type() == a.scalar_type(), op, ": b must have the dtype of a");
  TORCH_CHECK(b.sizes() == a.sizes(), op, ": b must have the shape of a");
  at::Tensor out = at::empty(a.sizes(), a.options());
  const int64_t numel = a.numel();
  if (numel == 0) return out;
  keel::FusedMulAddParams p{};
  p.dtype = dt;
  p.out = out.data_ptr();
  p.a = a.data_ptr();
  p.b = b.data_ptr();
  p.c = c;
  p.numel = numel;
  constexpr int64_t kChunk = 16384;
  if (a.is_contiguous() && b.is_contiguous()) {
    p.cols = kChunk;
    p.rows = (numel + kChunk - 1) / kChunk;
    p.a_rows.ndim = p.b_rows.ndim = 1;
    p.a_rows.sizes[0] = p.b_rows.sizes[0] = p.rows;
    p.a_rows.strides[0] = p.b_rows.strides[0] = kChunk;
    p.a_col = p.b_col = 1;
  } else {
    p.cols = a.dim() ? a.size(-1) : 1;
    p.rows = numel / p.cols;
    p.a_rows = rows_of(a, a.dim() - 1);
    p.b_rows = rows_of(b, b.dim() - 1);
    p.a_col = a.dim() ? a.stride(-1) : 1;
    p.b_col = b.dim() ? b.stride(-1) : 1;
  }
  const int64_t grain = p.cols >= 32768 ? 1 : 32768 / p.cols;
  if (p.rows <= grain) {
    keel::cpu::fused_muladd_rows(p, 0, p.rows);
  } else {
    at::parallel_for(0, p.rows, grain, [&](int64_t s, int64_t e) { keel::cpu::fused_muladd_rows(p, s, e); });
  }
  return out;
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  constexpr const char* op = "keel_twin::rms_norm";
  TORCH_CHECK(x.device().is_cpu(), op, ": x must be a CPU tensor");
  keel::RmsNormParams p{};
  p.dtype = float_dtype(op, "x", x);
  TORCH_CHECK(x.dim() >= 1, op, ": x must have at least 1 dimension");
  p.hidden = x.size(-1);
  TORCH_CHECK(weight.device() == x.device(), op, ": weight must be on the device of x");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), op, ": weight must have the dtype of x");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == p.hidden, op, ": weight must be 1-D with ", p.hidden, " elements");
  TORCH_CHECK(eps >= 0.0 && eps == eps, op, ": eps must be a non-negative number");
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  p.rows = rows;
  p.eps = static_cast<float>(eps);
  p.x = x.data_ptr();
  p.x_rows = rows_of(x, x.dim() - 1);
  p.x_col = x.stride(-1);
  p.weight = weight.data_ptr();
  p.w_col = weight.stride(0);
  at::Tensor out = at::empty(x.sizes(), x.options());
  p.out = out.data_ptr();
  p.out_rows.ndim = 1;
  p.out_rows.sizes[0] = p.rows;
  p.out_rows.strides[0] = p.hidden;
  p.out_col = 1;
  if (p.rows == 0 || p.hidden == 0) return out;
  const int64_t grain = p.hidden >= 16384 ? 1 : 16384 / p.hidden;
  if (p.rows <= grain) {
    keel::cpu::rms_norm_rows(p, 0, p.rows);
  } else {
    at::parallel_for(0, p.rows, grain, [&](int64_t s, int64_t e) { keel::cpu::rms_norm_rows(p, s, e); });
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(keel_twin, m) {
  m.def("fused_muladd(Tensor a, Tensor b, float c) -> Tensor");
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(keel_twin, CPU, m) {
  m.impl("fused_muladd", &fused_muladd);
  m.impl("rms_norm", &rms_norm);
}
