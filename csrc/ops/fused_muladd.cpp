// keel/csrc/ops/fused_muladd.cpp
// keel::fused_muladd(Tensor a, Tensor b, float c) -> Tensor: a * b + c in one pass.
// Compiled into _C (CPU) and _C_cuda (CUDA); the kernels live in fused_muladd_cpu.cpp
// and fused_muladd.cu.
#include "ops/fused_muladd.h"

#include "stable/alloc.h"
#include "stable/device.h"
#include "stable/layout.h"
#include "stable/library.h"
#include "stable/parallel.h"

namespace keel {
namespace {

constexpr const char* kOp = "keel::fused_muladd";
constexpr int64_t kChunk = 16384;  // columns per row when both inputs are contiguous

}  // namespace

Tensor fused_muladd(const Tensor& a, const Tensor& b, double c) {
  check_library_device(kOp, "a", a);
  check_same_device(kOp, "b", b, "a", a);
  // float64 too (unlike the other ops): autograd's gradcheck needs double precision
  const DType dt = dtype_code(a) == shim_codes().float64 ? DType::kFloat64 : check_float_dtype(kOp, "a", a, true);
  check_same_dtype(kOp, "b", b, "a", a);
  check_same_shape(kOp, "b", b, "a", a);

  Tensor out = empty_like_contiguous(a);
  const int64_t numel = a.numel();
  if (numel == 0) return out;

  FusedMulAddParams p{};
  p.dtype = dt;
  p.out = out.data_ptr();
  p.a = a.data_ptr();
  p.b = b.data_ptr();
  p.c = c;
  p.numel = numel;
  if (a.is_contiguous() && b.is_contiguous()) {
    p.cols = kChunk;
    p.rows = (numel + kChunk - 1) / kChunk;
    p.a_rows.ndim = p.b_rows.ndim = 1;
    p.a_rows.sizes[0] = p.b_rows.sizes[0] = p.rows;
    p.a_rows.strides[0] = p.b_rows.strides[0] = kChunk;
    p.a_col = p.b_col = 1;
  } else {
    const int64_t lead = a.dim() - 1;
    p.cols = a.dim() ? a.size(-1) : 1;
    p.rows = numel / p.cols;
    p.a_rows = row_layout(kOp, "a", a, lead);
    p.b_rows = row_layout(kOp, "b", b, lead);
    p.a_col = a.dim() ? a.stride(-1) : 1;
    p.b_col = b.dim() ? b.stride(-1) : 1;
  }

  LaunchContext ctx(a);
#ifdef KEEL_CUDA_LIBRARY
  fused_muladd_cuda(p, ctx.stream());
#else
  parallel_for(p.rows, grain_for(p.cols, 32768),
               [&](int64_t begin, int64_t end) { cpu::fused_muladd_rows(p, begin, end); });
#endif
  return out;
}

}  // namespace keel

KEEL_LIBRARY_IMPL(m) { m.impl("fused_muladd", TORCH_BOX(&keel::fused_muladd)); }
