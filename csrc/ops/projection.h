// keel/csrc/ops/projection.h
// A projection inside the fused layer ops (keel::layer_qkv, keel::layer_mlp): four schema arguments named after it
// (`qkv_weight`, `qkv_scale`, `qkv_bias`, `qkv_special_rows`) that describe either keel::linear's weight (in the
// activations' dtype; no scale, no special rows) or keel::fp8_linear's (float8_e4m3fn with its fp32 block scales and
// optional special rows), plus an optional bias. Checked once per op call, then run by those ops' own CPU code, so a
// projection gives the bits of the op it stands for.
#pragma once

#include <cstdint>
#include <optional>

#include "ops/fp8_linear.h"
#include "stable/tensor.h"

namespace keel {

struct Projection {
  const char* name;  // the arguments' prefix in messages
  const Tensor& weight;
  const std::optional<Tensor>& scale;
  const std::optional<Tensor>& bias;
  const std::optional<Tensor>& special_rows;
  bool fp8 = false;  // set by check_projection
  int64_t n = 0;     // output features, set by check_projection
};

// Checks `p` for activations [*, k] with the dtype and device of `ref` (named `ref_arg`); n_expected >= 0 fixes the
// output features (`n_what` says why, for the message).
void check_projection(const char* op, Projection& p, const char* ref_arg, const Tensor& ref, int64_t k,
                      int64_t n_expected, const char* n_what);

// The FP8 weight of keel::fp8_linear's arguments, as its CPU kernels read it.
Fp8Weight fp8_weight(const Tensor& qweight, const Tensor& scale, const std::optional<Tensor>& bias,
                     const std::optional<Tensor>& special_rows);

#ifndef KEEL_CUDA_LIBRARY
// out [m, p.n] = x [m, k] @ p^T (+ bias): contiguous rows of dtype dt, through keel::linear's or keel::fp8_linear's
// CPU code.
void run_projection(const Projection& p, DType dt, const void* x, int64_t m, int64_t k, void* out);
#else
// x [m, k] @ p^T (+ bias) through aten::linear (an FP8 weight was refused by check_projection).
Tensor run_projection(const Projection& p, const Tensor& x);
#endif

}  // namespace keel
