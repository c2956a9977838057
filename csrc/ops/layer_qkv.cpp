// keel/csrc/ops/layer_qkv.cpp
// keel::layer_qkv: a decoder layer's attention input in one call, for any number of tokens (prompt chunks, decode
// steps, batches). For rows T:
//   residual += x (when x is given: the previous layer's output); h = rms_norm(residual, norm_weight, eps)
//   qkv = h @ qkv_weight^T (+ qkv_bias)           keel::linear's or keel::fp8_linear's code
//   q, k = rms_norm per head (q_norm_weight, k_norm_weight; optional: Qwen3)
//   q, k rotated by cos_sin_cache[positions] (NeoX halves)
//   k, v written to key_cache / value_cache at slot_mapping (-1: skipped)
// and returns q [T, num_heads, head_size], ready for the attention over the cache. Each step runs the kernel of the
// op it stands for with the parameters that op passes, so the results are that sequence of ops' bits.
#include <cstring>
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

constexpr const char* kOp = "keel::layer_qkv";
constexpr int64_t kMaxHeads = 65536;  // (keeps the row counts below far from int64 overflow)

struct QkvShape {
  int64_t t, hidden, heads, kv_heads, d, n;
  DType dt;
};

// `w` (when given) must be a norm weight [size] on residual's device with its dtype.
void check_norm_vector(const char* arg, const Tensor& w, const Tensor& residual, int64_t size, const char* what) {
  check_same_device(kOp, arg, w, "residual", residual);
  check_same_dtype(kOp, arg, w, "residual", residual);
  KEEL_CHECK(w.dim() == 1 && w.size(0) == size, kOp, ": ", arg, " must be 1-D with ", size, " elements (", what,
             "), got shape ", shape_str(w));
}

void check_index(const char* arg, const Tensor& t, const Tensor& residual, int64_t tokens) {
  check_same_device(kOp, arg, t, "residual", residual);
  KEEL_CHECK(dtype_code(t) == shim_codes().int64, kOp, ": ", arg, " must be int64, got ",
             scalar_type_name(t.scalar_type()));
  KEEL_CHECK(t.dim() == 1 && t.size(0) == tokens, kOp, ": ", arg, " must be 1-D with one entry per token (", tokens,
             "), got shape ", shape_str(t));
}

QkvShape check_args(const std::optional<Tensor>& x, const Tensor& residual, const Tensor& norm_weight, double eps,
                    int64_t num_heads, int64_t num_kv_heads, const Tensor& key_cache, const Tensor& value_cache) {
  check_library_device(kOp, "residual", residual);
  QkvShape s{};
  s.dt = check_float_dtype(kOp, "residual", residual);
  check_dim(kOp, "residual", residual, 2);
  s.t = residual.size(0);
  s.hidden = residual.size(1);
  if (x.has_value()) {
    check_same_device(kOp, "x", *x, "residual", residual);
    check_same_dtype(kOp, "x", *x, "residual", residual);
    check_same_shape(kOp, "x", *x, "residual", residual);
  }
  check_norm_vector("norm_weight", norm_weight, residual, s.hidden, "the last dim of residual");
  KEEL_CHECK(eps >= 0.0 && eps == eps, kOp, ": eps must be a non-negative number, got ", eps);
  KEEL_CHECK(num_heads > 0 && num_kv_heads > 0 && num_heads <= kMaxHeads && num_kv_heads <= kMaxHeads, kOp,
             ": num_heads and num_kv_heads must be in [1, ", kMaxHeads, "], got ", num_heads, " and ", num_kv_heads);
  check_same_device(kOp, "key_cache", key_cache, "residual", residual);
  check_same_dtype(kOp, "key_cache", key_cache, "residual", residual);
  check_dim(kOp, "key_cache", key_cache, 4);
  check_same_device(kOp, "value_cache", value_cache, "residual", residual);
  check_same_dtype(kOp, "value_cache", value_cache, "residual", residual);
  check_same_shape(kOp, "value_cache", value_cache, "key_cache", key_cache);
  KEEL_CHECK(key_cache.size(1) > 0 && key_cache.size(2) == num_kv_heads && key_cache.size(3) > 0, kOp,
             ": key_cache must be [num_blocks, block_size > 0, num_kv_heads=", num_kv_heads, ", head_size > 0], got ",
             shape_str(key_cache));
  s.heads = num_heads;
  s.kv_heads = num_kv_heads;
  s.d = key_cache.size(3);
  s.n = (num_heads + 2 * num_kv_heads) * s.d;
  return s;
}

void check_rope(const Tensor& cos_sin_cache, const Tensor& residual, const QkvShape& s) {
  check_same_device(kOp, "cos_sin_cache", cos_sin_cache, "residual", residual);
  check_dim(kOp, "cos_sin_cache", cos_sin_cache, 2);
  const int64_t rot = cos_sin_cache.size(1);
  KEEL_CHECK(rot > 0 && rot % 2 == 0 && rot <= s.d, kOp,
             ": cos_sin_cache must be [max_position, rot_dim] with an even rot_dim <= head_size=", s.d, ", got shape ",
             shape_str(cos_sin_cache));
  const int32_t ct = dtype_code(cos_sin_cache);
  KEEL_CHECK(ct == shim_codes().float32 || ct == dtype_code(residual), kOp,
             ": cos_sin_cache must be float32 or the dtype of residual (", scalar_type_name(residual.scalar_type()),
             "), got ", scalar_type_name(cos_sin_cache.scalar_type()));
}

// What the op writes in place must not share memory with what it reads (checks only the kernel can make).
void check_overlaps(const std::optional<Tensor>& x, const Tensor& residual, const Tensor& norm_weight,
                    const Tensor& key_cache, const Tensor& value_cache) {
  KEEL_CHECK(internal_overlap(residual) != InternalOverlap::kYes, kOp,
             ": residual is written in place but has overlapping elements (e.g. from expand); pass a clone");
  if (x.has_value()) check_no_overlap(kOp, "residual", residual, "x", *x);
  check_no_overlap(kOp, "residual", residual, "norm_weight", norm_weight);
  KEEL_CHECK(internal_overlap(key_cache) != InternalOverlap::kYes, kOp,
             ": key_cache is written in place but has overlapping elements");
  KEEL_CHECK(internal_overlap(value_cache) != InternalOverlap::kYes, kOp,
             ": value_cache is written in place but has overlapping elements");
  check_no_overlap(kOp, "key_cache", key_cache, "value_cache", value_cache);
  check_no_overlap(kOp, "key_cache", key_cache, "residual", residual);
  check_no_overlap(kOp, "value_cache", value_cache, "residual", residual);
}

// One rms_norm row set: `rows` rows over a [tokens, heads] grid (token stride ts, head stride hs) of `src`, `d`
// wide, into contiguous `out`; with `residual`, residual += src first (fused_add_rms_norm's order).
RmsNormParams norm_params(const QkvShape& s, const void* src, RowLayout src_rows, int64_t src_col, void* residual,
                          RowLayout res_rows, int64_t res_col, const Tensor& weight, double eps, void* out,
                          int64_t rows, int64_t d) {
  RmsNormParams p{};
  p.dtype = s.dt;
  p.x = src;
  p.x_rows = src_rows;
  p.x_col = src_col;
  p.out = out;
  p.out_rows = layer::rows_of(rows, d);
  p.out_col = 1;
  p.residual = residual;
  p.res_rows = res_rows;
  p.res_col = res_col;
  p.weight = weight.data_ptr();
  p.w_col = weight.stride(0);
  p.rows = rows;
  p.hidden = d;
  p.eps = static_cast<float>(eps);
  return p;
}

// The [tokens, heads] rows of a head group inside the qkv rows (head_size d, qkv row stride n).
RowLayout head_rows(const QkvShape& s, int64_t heads) {
  RowLayout l;
  l.ndim = 2;
  l.sizes[0] = s.t;
  l.strides[0] = s.n;
  l.sizes[1] = heads;
  l.strides[1] = s.d;
  return l;
}

RotaryTensor rotary_rows(void* data, int64_t tokens, int64_t token_stride, int64_t heads, int64_t d) {
  RotaryTensor r{};
  r.data = data;
  r.tokens = layer::rows_of(tokens, token_stride);
  r.head_stride = d;
  r.elem_stride = 1;
  r.num_heads = heads;
  return r;
}

// q and k rotated in place (q contiguous [T, H, D]; k rows every k_stride elements), positions checked first.
void rotate(const QkvShape& s, const Tensor& positions, const Tensor& cos_sin_cache, void* q, void* k, int64_t k_stride,
            const LaunchContext& ctx) {
  RotaryParams p{};
  p.dtype = s.dt;
  p.cache_dtype = dtype_code(cos_sin_cache) == shim_codes().float32 ? DType::kFloat32 : s.dt;
  p.positions = static_cast<const int64_t*>(positions.data_ptr());
  p.pos_rows = layer::rows_of(s.t, positions.stride(0));
  p.q = rotary_rows(q, s.t, s.heads * s.d, s.heads, s.d);
  p.k = rotary_rows(k, s.t, k_stride, s.kv_heads, s.d);
  p.cache = cos_sin_cache.data_ptr();
  p.cache_row_stride = cos_sin_cache.stride(0);
  p.cache_col_stride = cos_sin_cache.stride(1);
  p.rot_dim = cos_sin_cache.size(1);
  p.num_tokens = s.t;
  p.max_position = cos_sin_cache.size(0);
  p.is_neox = true;
#ifndef KEEL_CUDA_LIBRARY
  for (int64_t t = 0; t < s.t; ++t) {
    const int64_t pos = p.positions[t * positions.stride(0)];
    KEEL_CHECK(pos >= 0 && pos < p.max_position, kOp, ": positions[", t, "]=", pos, " is outside cos_sin_cache's ",
               p.max_position, " rows");
  }
#endif
  layer::rotary(p, ctx);
}

CacheSide cache_side(const void* src, int64_t src_t, int64_t d, const Tensor& cache) {
  CacheSide c{};
  c.src = src;
  c.src_t = src_t;
  c.src_h = d;
  c.src_d = 1;
  c.cache = cache.data_ptr();
  c.c_b = cache.stride(0);
  c.c_s = cache.stride(1);
  c.c_h = cache.stride(2);
  c.c_d = cache.stride(3);
  return c;
}

void write_cache(const QkvShape& s, const void* k, int64_t k_stride, const void* v, Tensor& key_cache,
                 Tensor& value_cache, const Tensor& slot_mapping, const LaunchContext& ctx) {
  ReshapeAndCacheParams p{};
  p.element_size = layer::element_size(s.dt);
  p.slots = static_cast<const int64_t*>(slot_mapping.data_ptr());
  p.slot_stride = slot_mapping.stride(0);
  p.key = cache_side(k, k_stride, s.d, key_cache);
  p.value = cache_side(v, s.n, s.d, value_cache);
  p.num_tokens = s.t;
  p.kv_heads = s.kv_heads;
  p.head_size = s.d;
  p.block_size = key_cache.size(1);
  p.capacity = key_cache.size(0) * p.block_size;
#ifndef KEEL_CUDA_LIBRARY
  check_cache_slots(kOp, p, p.capacity);
#endif
  layer::cache_write(p, ctx);
}

// q's rows of the projection into the result (no norm: a copy, the bits as they are).
void copy_q(const QkvShape& s, const char* qkv_rows, Tensor& q, layer::Scratch& scratch) {
#ifdef KEEL_CUDA_LIBRARY
  (void)qkv_rows;
  Tensor dst = torch::stable::view(q, {s.t, s.heads * s.d});
  Tensor qkv = scratch.tensor(1);
  torch::stable::copy_(dst, torch::stable::narrow(qkv, 1, 0, s.heads * s.d));
#else
  (void)scratch;
  const int64_t es = layer::element_size(s.dt);
  char* dst = static_cast<char*>(q.data_ptr());
  for (int64_t t = 0; t < s.t; ++t)
    std::memcpy(dst + t * s.heads * s.d * es, qkv_rows + t * s.n * es, s.heads * s.d * es);
#endif
}

}  // namespace

Tensor layer_qkv(std::optional<Tensor> x, Tensor residual, const Tensor& norm_weight, double eps,
                 const Tensor& qkv_weight, std::optional<Tensor> qkv_scale, std::optional<Tensor> qkv_bias,
                 std::optional<Tensor> qkv_special_rows, std::optional<Tensor> q_norm_weight,
                 std::optional<Tensor> k_norm_weight, const Tensor& positions, const Tensor& cos_sin_cache,
                 int64_t num_heads, int64_t num_kv_heads, Tensor key_cache, Tensor value_cache,
                 const Tensor& slot_mapping) {
  const QkvShape s = check_args(x, residual, norm_weight, eps, num_heads, num_kv_heads, key_cache, value_cache);
  Projection qkv{"qkv", qkv_weight, qkv_scale, qkv_bias, qkv_special_rows};
  check_projection(kOp, qkv, "residual", residual, s.hidden, s.n, "rows: (num_heads + 2 * num_kv_heads) * head_size");
  KEEL_CHECK(q_norm_weight.has_value() == k_norm_weight.has_value(), kOp,
             ": q_norm_weight and k_norm_weight must be given together (or neither)");
  if (q_norm_weight.has_value()) {
    check_norm_vector("q_norm_weight", *q_norm_weight, residual, s.d, "head_size");
    check_norm_vector("k_norm_weight", *k_norm_weight, residual, s.d, "head_size");
  }
  check_index("positions", positions, residual, s.t);
  check_rope(cos_sin_cache, residual, s);
  check_index("slot_mapping", slot_mapping, residual, s.t);
  check_overlaps(x, residual, norm_weight, key_cache, value_cache);

  const int32_t code = dtype_code(residual);
  Tensor q = empty_contiguous({s.t, s.heads, s.d}, code, residual);
  if (s.t == 0) return q;
  LaunchContext ctx(residual);
  layer::Scratch scratch(s.dt, code, residual);
  void* h = scratch.get(0, s.t, s.hidden);
  const RowLayout res_rows = row_layout(kOp, "residual", residual, 1);
  if (x.has_value()) {
    layer::rms_norm(norm_params(s, x->data_ptr(), row_layout(kOp, "x", *x, 1), x->stride(1), residual.data_ptr(),
                                res_rows, residual.stride(1), norm_weight, eps, h, s.t, s.hidden),
                    ctx);
  } else {
    layer::rms_norm(norm_params(s, residual.data_ptr(), res_rows, residual.stride(1), nullptr, RowLayout{}, 0,
                                norm_weight, eps, h, s.t, s.hidden),
                    ctx);
  }
#ifdef KEEL_CUDA_LIBRARY
  scratch.set(1, run_projection(qkv, scratch.tensor(0)));
  char* qkv_rows = static_cast<char*>(scratch.tensor(1).data_ptr());
#else
  char* qkv_rows = static_cast<char*>(scratch.get(1, s.t, s.n));
  run_projection(qkv, s.dt, h, s.t, s.hidden, qkv_rows);
#endif
  const int64_t es = layer::element_size(s.dt);
  char* k = qkv_rows + s.heads * s.d * es;
  const char* v = k + s.kv_heads * s.d * es;
  int64_t k_stride = s.n;
  if (q_norm_weight.has_value()) {  // rms_norm per head: q into the result, k into its own rows
    layer::rms_norm(norm_params(s, qkv_rows, head_rows(s, s.heads), 1, nullptr, RowLayout{}, 0, *q_norm_weight, eps,
                                q.data_ptr(), s.t * s.heads, s.d),
                    ctx);
    void* kn = scratch.get(2, s.t, s.kv_heads * s.d);
    layer::rms_norm(norm_params(s, k, head_rows(s, s.kv_heads), 1, nullptr, RowLayout{}, 0, *k_norm_weight, eps, kn,
                                s.t * s.kv_heads, s.d),
                    ctx);
    k = static_cast<char*>(kn);
    k_stride = s.kv_heads * s.d;
  } else {
    copy_q(s, qkv_rows, q, scratch);
  }
  rotate(s, positions, cos_sin_cache, q.data_ptr(), k, k_stride, ctx);
  write_cache(s, k, k_stride, v, key_cache, value_cache, slot_mapping, ctx);
  return q;
}

}  // namespace keel

KEEL_LIBRARY_IMPL(m) { m.impl("layer_qkv", TORCH_BOX(&keel::layer_qkv)); }
