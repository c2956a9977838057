// keel/csrc/ops/silu_and_mul.cpp
// keel::silu_and_mul(Tensor x) -> Tensor   (x: [..., 2d] -> out: [..., d])
// Kernels: silu_and_mul_cpu.cpp, silu_and_mul.cu.
#include "ops/silu_and_mul.h"

#include "stable/alloc.h"
#include "stable/device.h"
#include "stable/layout.h"
#include "stable/library.h"
#include "stable/parallel.h"

namespace keel {

Tensor silu_and_mul(const Tensor& x) {
  constexpr const char* op = "keel::silu_and_mul";
  check_library_device(op, "x", x);
  const DType dt = check_float_dtype(op, "x", x);
  check_min_dim(op, "x", x, 1);
  KEEL_CHECK(x.size(-1) % 2 == 0, op, ": x last dim must be even (gate and up halves), got shape ", shape_str(x));
  std::vector<int64_t> out_sizes = sizes_of(x);
  out_sizes.back() /= 2;
  Tensor out = empty_contiguous(out_sizes, dtype_code(x), x);

  SiluAndMulParams p{};
  p.dtype = dt;
  p.out = out.data_ptr();
  p.x = x.data_ptr();
  p.x_rows = row_layout(op, "x", x, x.dim() - 1);
  p.x_col = x.stride(-1);
  p.rows = leading_numel(x, x.dim() - 1);
  p.d = out_sizes.back();
  if (p.rows == 0 || p.d == 0) return out;

  LaunchContext ctx(x);
#ifdef KEEL_CUDA_LIBRARY
  silu_and_mul_cuda(p, ctx.stream());
#else
  // a decode step's few rows run inline: a parallel region costs more than their work
  parallel_for(p.rows, grain_for(p.d, 32768), [&](int64_t b, int64_t e) { cpu::silu_and_mul_rows(p, b, e); });
#endif
  return out;
}

}  // namespace keel

KEEL_LIBRARY_IMPL(m) { m.impl("silu_and_mul", TORCH_BOX(&keel::silu_and_mul)); }
