// keel/csrc/ops/layer_mlp.cpp
// keel::layer_mlp: a decoder layer after its attention in one call, for any number of tokens. For rows T:
//   o = attn @ o_weight^T (+ o_bias)
//   residual += o; h = rms_norm(residual, norm_weight, eps)      (fused_add_rms_norm's order)
//   gu = h @ gate_up_weight^T (+ gate_up_bias); a = silu(gu[:, :I]) * gu[:, I:]
//   returns a @ down_weight^T (+ down_bias)   [T, hidden]
// Each projection is keel::linear's or keel::fp8_linear's code, each row step the kernel of the op it stands for
// with that op's parameters, so the results are that sequence of ops' bits.
#include <optional>

#include "ops/layer_common.h"
#include "ops/projection.h"
#include "stable/check.h"
#include "stable/dispatcher.h"
#include "stable/layout.h"
#include "stable/library.h"
#include "stable/overlap.h"

namespace keel {
namespace {

constexpr const char* kOp = "keel::layer_mlp";

// residual, attn, norm_weight and eps; returns the dtype
DType check_args(const Tensor& attn, const Tensor& residual, const Tensor& norm_weight, double eps) {
  check_library_device(kOp, "residual", residual);
  const DType dt = check_float_dtype(kOp, "residual", residual);
  check_dim(kOp, "residual", residual, 2);
  check_same_device(kOp, "attn", attn, "residual", residual);
  check_same_dtype(kOp, "attn", attn, "residual", residual);
  KEEL_CHECK(attn.dim() == 2 && attn.size(0) == residual.size(0), kOp, ": attn must be [", residual.size(0),
             ", K] (a row per row of residual), got shape ", shape_str(attn));
  check_same_device(kOp, "norm_weight", norm_weight, "residual", residual);
  check_same_dtype(kOp, "norm_weight", norm_weight, "residual", residual);
  KEEL_CHECK(norm_weight.dim() == 1 && norm_weight.size(0) == residual.size(1), kOp, ": norm_weight must be 1-D with ",
             residual.size(1), " elements (the last dim of residual), got shape ", shape_str(norm_weight));
  KEEL_CHECK(eps >= 0.0 && eps == eps, kOp, ": eps must be a non-negative number, got ", eps);
  return dt;
}

RmsNormParams add_norm_params(DType dt, void* o, const Tensor& residual, const Tensor& weight, double eps) {
  const int64_t t = residual.size(0), hidden = residual.size(1);
  RmsNormParams p{};
  p.dtype = dt;
  p.x = o;
  p.x_rows = layer::rows_of(t, hidden);
  p.x_col = 1;
  p.out = o;  // h over o, in place, as fused_add_rms_norm writes it over its x
  p.out_rows = p.x_rows;
  p.out_col = 1;
  p.residual = residual.data_ptr();
  p.res_rows = row_layout(kOp, "residual", residual, 1);
  p.res_col = residual.stride(1);
  p.weight = weight.data_ptr();
  p.w_col = weight.stride(0);
  p.rows = t;
  p.hidden = hidden;
  p.eps = static_cast<float>(eps);
  return p;
}

SiluAndMulParams silu_params(DType dt, const void* gu, void* out, int64_t rows, int64_t d) {
  SiluAndMulParams p{};
  p.dtype = dt;
  p.out = out;
  p.x = gu;
  p.x_rows = layer::rows_of(rows, 2 * d);
  p.x_col = 1;
  p.rows = rows;
  p.d = d;
  return p;
}

// attn's rows, contiguous: as they are, or copied (a strided attn; the values as they are).
const void* attn_rows(const Tensor& attn, DType dt) {
  if (attn.is_contiguous()) return attn.data_ptr();
  thread_local std::vector<uint16_t> rows;
  const int64_t m = attn.size(0), k = attn.size(1);
  rows.resize(static_cast<size_t>(m * k * layer::element_size(dt) / 2));
  dispatch_storage(dt, [&](auto tag) {
    using T = decltype(tag);
    copy_rows<T>(kOp, "attn", attn, reinterpret_cast<T*>(rows.data()), k, [](const T* v) { return *v; });
  });
  return rows.data();
}

}  // namespace

Tensor layer_mlp(const Tensor& attn, Tensor residual, const Tensor& o_weight, std::optional<Tensor> o_scale,
                 std::optional<Tensor> o_bias, std::optional<Tensor> o_special_rows, const Tensor& norm_weight,
                 double eps, const Tensor& gate_up_weight, std::optional<Tensor> gate_up_scale,
                 std::optional<Tensor> gate_up_bias, std::optional<Tensor> gate_up_special_rows,
                 const Tensor& down_weight, std::optional<Tensor> down_scale, std::optional<Tensor> down_bias,
                 std::optional<Tensor> down_special_rows) {
  const DType dt = check_args(attn, residual, norm_weight, eps);
  const int64_t t = residual.size(0), hidden = residual.size(1);
  Projection o{"o", o_weight, o_scale, o_bias, o_special_rows};
  check_projection(kOp, o, "residual", residual, attn.size(1), hidden, "rows: the last dim of residual");
  Projection gate_up{"gate_up", gate_up_weight, gate_up_scale, gate_up_bias, gate_up_special_rows};
  check_projection(kOp, gate_up, "residual", residual, hidden, -1, "gate and up halves");
  KEEL_CHECK(gate_up.n % 2 == 0, kOp, ": gate_up_weight must have an even number of rows (gate and up halves), got ",
             shape_str(gate_up_weight));
  const int64_t inter = gate_up.n / 2;
  Projection down{"down", down_weight, down_scale, down_bias, down_special_rows};
  check_projection(kOp, down, "residual", residual, inter, hidden, "rows: the last dim of residual");
  KEEL_CHECK(internal_overlap(residual) != InternalOverlap::kYes, kOp,
             ": residual is written in place but has overlapping elements (e.g. from expand); pass a clone");
  check_no_overlap(kOp, "residual", residual, "attn", attn);
  check_no_overlap(kOp, "residual", residual, "norm_weight", norm_weight);

  const int32_t code = dtype_code(residual);
#ifdef KEEL_CUDA_LIBRARY
  if (t == 0) return empty_contiguous({t, hidden}, code, residual);
  LaunchContext ctx(residual);
  Tensor ob = run_projection(o, attn);
  layer::rms_norm(add_norm_params(dt, ob.data_ptr(), residual, norm_weight, eps), ctx);
  Tensor gu = run_projection(gate_up, ob);
  Tensor a = empty_contiguous({t, inter}, code, residual);
  layer::silu_and_mul(silu_params(dt, gu.data_ptr(), a.data_ptr(), t, inter), ctx);
  return run_projection(down, a);
#else
  Tensor out = empty_contiguous({t, hidden}, code, residual);
  if (t == 0) return out;
  LaunchContext ctx(residual);
  layer::Scratch scratch(dt, code, residual);
  void* ob = scratch.get(0, t, hidden);
  run_projection(o, dt, attn_rows(attn, dt), t, attn.size(1), ob);
  layer::rms_norm(add_norm_params(dt, ob, residual, norm_weight, eps), ctx);
  void* gu = scratch.get(1, t, gate_up.n);
  run_projection(gate_up, dt, ob, t, hidden, gu);
  void* a = scratch.get(2, t, inter);
  layer::silu_and_mul(silu_params(dt, gu, a, t, inter), ctx);
  run_projection(down, dt, a, t, inter, out.data_ptr());
  return out;
#endif
}

}  // namespace keel

KEEL_LIBRARY_IMPL(m) { m.impl("layer_mlp", TORCH_BOX(&keel::layer_mlp)); }
