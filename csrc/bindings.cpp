// keel/csrc/bindings.cpp
// Every schema of the `keel` op namespace, in one place. Implementations register
// per dispatch key next to their code (csrc/ops/<op>.cpp): CPU in _C, CUDA in _C_cuda.
#include "stable/library.h"

KEEL_LIBRARY(m) {
  // a * b + c elementwise in one pass; same shape and dtype, contiguous result.
  m.def("fused_muladd(Tensor a, Tensor b, float c) -> Tensor");
  // x / sqrt(mean(x^2, -1) + eps) * weight over the last dim; new contiguous tensor.
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  // residual += x; x = rms_norm(residual, weight, eps); both updated in place.
  m.def("fused_add_rms_norm(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps) -> ()");
  // Rotates q and k in place by cos_sin_cache[positions] (NeoX halves or GPT-J pairs).
  m.def(
      "rotary_embedding(Tensor positions, Tensor(a!) q, Tensor(b!) k, int head_size, "
      "Tensor cos_sin_cache, bool is_neox) -> ()");
  // silu(x[..., :d]) * x[..., d:] for x of last dim 2d; new contiguous tensor.
  m.def("silu_and_mul(Tensor x) -> Tensor");
  // Writes key/value rows of each token into the paged caches at slot_mapping (-1: padding, skipped).
  m.def(
      "reshape_and_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
      "Tensor slot_mapping) -> ()");
  // x @ weight.T + bias for x [..., K], weight [N, K] (unit K stride), bias [N]; new contiguous [..., N].
  m.def("linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  // x @ dequant(qweight).T + bias for an e4m3 qweight [N, K] with fp32 scales per 128-wide K block, one per
  // row ([N, ceil(K/128)]) or per 128 rows ([ceil(N/128), ceil(K/128)]); x is not quantized. CPU only.
  // special_rows (bool [N], optional): fp8_special_rows(qweight), computed once at load; the one-row GEMV then
  // skips its per-call scan of the weight for e4m3 bytes its fast decode cannot take.
  m.def("fp8_linear(Tensor x, Tensor qweight, Tensor scale, Tensor? bias, Tensor? special_rows=None) -> Tensor");
  // bool [N]: whether row n of an e4m3 qweight [N, K] holds a subnormal or NaN byte. CPU only.
  m.def("fp8_special_rows(Tensor qweight) -> Tensor");
  // A decoder layer up to its attention, for T tokens: residual += x (when given); h = rms_norm(residual);
  // qkv = h @ qkv_weight^T (+ qkv_bias); q and k rms-normed per head (when q/k norm weights are given) and rotated
  // by cos_sin_cache[positions] (NeoX); k and v written to the paged caches at slot_mapping (-1: skipped). Returns
  // q [T, num_heads, head_size] (head_size: key_cache's last dim). A projection's weight is keel::linear's (the
  // activations' dtype) or keel::fp8_linear's (float8_e4m3fn with its scale and optional special_rows; CPU only).
  m.def(
      "layer_qkv(Tensor? x, Tensor(a!) residual, Tensor norm_weight, float eps, Tensor qkv_weight, Tensor? qkv_scale, "
      "Tensor? qkv_bias, Tensor? qkv_special_rows, Tensor? q_norm_weight, Tensor? k_norm_weight, Tensor positions, "
      "Tensor cos_sin_cache, int num_heads, int num_kv_heads, Tensor(b!) key_cache, Tensor(c!) value_cache, "
      "Tensor slot_mapping) -> Tensor");
  // A decoder layer after its attention, for T tokens: o = attn @ o_weight^T; residual += o; h = rms_norm(residual);
  // returns (silu(gate) * up of h @ gate_up_weight^T) @ down_weight^T [T, hidden] (each projection as in layer_qkv).
  m.def(
      "layer_mlp(Tensor attn, Tensor(a!) residual, Tensor o_weight, Tensor? o_scale, Tensor? o_bias, "
      "Tensor? o_special_rows, Tensor norm_weight, float eps, Tensor gate_up_weight, Tensor? gate_up_scale, "
      "Tensor? gate_up_bias, Tensor? gate_up_special_rows, Tensor down_weight, Tensor? down_scale, Tensor? down_bias, "
      "Tensor? down_special_rows) -> Tensor");
}
