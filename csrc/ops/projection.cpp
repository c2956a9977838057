// keel/csrc/ops/projection.cpp
// The projections of the fused layer ops: their checks (worded like keel::linear's and keel::fp8_linear's, with the
// projection's argument names) and their CPU run through those ops' own code.
#include "ops/projection.h"

#include <string>

#include "ops/linear.h"
#include "stable/check.h"
#include "stable/dispatcher.h"

namespace keel {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// `t`, when given, must be on ref's device with the shape [n] (and dtype `dt_ref`'s unless bool_ is set).
void check_rows_vector(const char* op, const std::string& arg, const Tensor& t, const char* ref_arg, const Tensor& ref,
                       int64_t n, const std::string& weight_arg, bool bool_) {
  check_same_device(op, arg.c_str(), t, ref_arg, ref);
  if (bool_) {
    KEEL_CHECK(dtype_code(t) == aoti_torch_dtype_bool(), op, ": ", arg, " must be bool, got ",
               scalar_type_name(t.scalar_type()));
  } else {
    check_same_dtype(op, arg.c_str(), t, ref_arg, ref);
  }
  KEEL_CHECK(t.dim() == 1 && t.size(0) == n, op, ": ", arg, " must be [", n, "] to match ", weight_arg, "'s rows, got ",
             shape_str(t));
}

}  // namespace

void check_projection(const char* op, Projection& p, const char* ref_arg, const Tensor& ref, int64_t k,
                      int64_t n_expected, const char* n_what) {
  const std::string name = p.name;
  const std::string w = name + "_weight";
  check_same_device(op, w.c_str(), p.weight, ref_arg, ref);
  p.fp8 = dtype_code(p.weight) == aoti_torch_dtype_float8_e4m3fn();
  KEEL_CHECK(p.fp8 || dtype_code(p.weight) == dtype_code(ref), op, ": ", w,
             " must be float8_e4m3fn or have the dtype of ", ref_arg, " (", scalar_type_name(ref.scalar_type()),
             "), got ", scalar_type_name(p.weight.scalar_type()));
  if (n_expected >= 0) {
    KEEL_CHECK(p.weight.dim() == 2 && p.weight.size(0) == n_expected && p.weight.size(1) == k, op, ": ", w,
               " must be [", n_expected, ", ", k, "] (", n_what, "), got ", shape_str(p.weight));
  } else {
    KEEL_CHECK(p.weight.dim() == 2 && p.weight.size(1) == k, op, ": ", w, " must be [N, ", k, "] (", n_what, "), got ",
               shape_str(p.weight));
  }
  KEEL_CHECK(p.weight.stride(1) == 1 || k <= 1, op, ": ", w,
             " must have unit stride along its last dim (K), got stride ", p.weight.stride(1));
  p.n = p.weight.size(0);
  if (p.fp8) {
#ifdef KEEL_CUDA_LIBRARY
    KEEL_CHECK(false, op, ": ", w,
               " is float8_e4m3fn, which runs on the CPU only (CUDA runs FP8 through "
               "keel.vendored.deep_gemm)");
#endif
    const std::string s = name + "_scale";
    KEEL_CHECK(p.scale.has_value(), op, ": ", s, " must be given for a float8_e4m3fn ", w,
               " (fp32 scales per 128-wide K block)");
    check_same_device(op, s.c_str(), *p.scale, ref_arg, ref);
    KEEL_CHECK(dtype_code(*p.scale) == shim_codes().float32, op, ": ", s, " must be float32, got ",
               scalar_type_name(p.scale->scalar_type()));
    const int64_t kb = ceil_div(k, kFp8BlockK);
    KEEL_CHECK(p.scale->dim() == 2 && p.scale->size(1) == kb &&
                   (p.scale->size(0) == p.n || p.scale->size(0) == ceil_div(p.n, 128)),
               op, ": ", s, " must be [", p.n, ", ", kb, "] (per row) or [", ceil_div(p.n, 128), ", ", kb,
               "] (per 128 rows) for ", w, " ", shape_str(p.weight), ", got ", shape_str(*p.scale));
    if (p.special_rows.has_value()) {
      check_rows_vector(op, name + "_special_rows", *p.special_rows, ref_arg, ref, p.n, w, true);
    }
  } else {
    KEEL_CHECK(!p.scale.has_value(), op, ": ", name, "_scale is only for a float8_e4m3fn ", w, ", got a ",
               scalar_type_name(p.weight.scalar_type()), " ", w);
    KEEL_CHECK(!p.special_rows.has_value(), op, ": ", name, "_special_rows is only for a float8_e4m3fn ", w, ", got a ",
               scalar_type_name(p.weight.scalar_type()), " ", w);
  }
  if (p.bias.has_value()) check_rows_vector(op, name + "_bias", *p.bias, ref_arg, ref, p.n, w, false);
}

#ifndef KEEL_CUDA_LIBRARY
void run_projection(const Projection& p, DType dt, const void* x, int64_t m, int64_t k, void* out) {
  if (p.fp8) {
    fp8_linear_cpu(dt, x, m, k, fp8_weight(p.weight, *p.scale, p.bias, p.special_rows), out);
    return;
  }
  linear_cpu(dt, x, m, k, p.weight.data_ptr(), p.weight.stride(0), p.n,
             p.bias.has_value() ? p.bias->data_ptr() : nullptr, p.bias.has_value() ? p.bias->stride(0) : 0, out);
}
#else
Tensor run_projection(const Projection& p, const Tensor& x) {
  Tensor out = call_aten<Tensor>("aten::linear", "", x, p.weight, p.bias);
  return out.is_contiguous() ? out : torch::stable::contiguous(out);
}
#endif

}  // namespace keel
