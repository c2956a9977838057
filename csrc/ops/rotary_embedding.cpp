// keel/csrc/ops/rotary_embedding.cpp
// keel::rotary_embedding(Tensor positions, Tensor(a!) q, Tensor(b!) k, int head_size,
//                        Tensor cos_sin_cache, bool is_neox) -> ()
// q: [*positions.shape, num_heads * head_size] or [*positions.shape, num_heads, head_size];
// k likewise with its own head count. Kernels: rotary_embedding_cpu.cpp, rotary_embedding.cu.
#include "ops/rotary_embedding.h"

#include "stable/check.h"
#include "stable/device.h"
#include "stable/dispatcher.h"
#include "stable/layout.h"
#include "stable/library.h"
#include "stable/overlap.h"
#include "stable/parallel.h"

namespace keel {
namespace {

constexpr const char* kOp = "keel::rotary_embedding";

RotaryTensor describe(const char* arg, const Tensor& t, const Tensor& positions, int64_t head_size) {
  const int64_t pd = positions.dim();
  KEEL_CHECK(t.dim() == pd + 1 || t.dim() == pd + 2, kOp, ": ", arg, " must be [",
             pd == 1 ? "num_tokens" : "batch, seq", ", num_heads * head_size] or [...",
             ", num_heads, head_size] to match positions ", shape_str(positions), ", got shape ", shape_str(t));
  for (int64_t d = 0; d < pd; ++d) {
    KEEL_CHECK(t.size(d) == positions.size(d), kOp, ": ", arg, " leading dims must equal positions ",
               shape_str(positions), ", got shape ", shape_str(t));
  }
  KEEL_CHECK(internal_overlap(t) != InternalOverlap::kYes, kOp, ": ", arg,
             " is written in place but has overlapping elements (e.g. from expand); pass a clone");
  RotaryTensor r{};
  r.data = t.data_ptr();
  r.tokens = row_layout(kOp, arg, t, pd);
  r.elem_stride = t.stride(-1);
  if (t.dim() == pd + 2) {
    KEEL_CHECK(t.size(-1) == head_size, kOp, ": ", arg, " last dim must be head_size=", head_size, ", got shape ",
               shape_str(t));
    r.num_heads = t.size(-2);
    r.head_stride = t.stride(-2);
  } else {
    KEEL_CHECK(t.size(-1) % head_size == 0, kOp, ": ", arg, " last dim (", t.size(-1),
               ") must be a multiple of head_size=", head_size);
    r.num_heads = t.size(-1) / head_size;
    r.head_stride = head_size * r.elem_stride;
  }
  return r;
}

}  // namespace

void rotary_embedding(const Tensor& positions, Tensor q, Tensor k, int64_t head_size, const Tensor& cos_sin_cache,
                      bool is_neox) {
  check_library_device(kOp, "q", q);
  check_same_device(kOp, "k", k, "q", q);
  check_same_device(kOp, "positions", positions, "q", q);
  check_same_device(kOp, "cos_sin_cache", cos_sin_cache, "q", q);
  const DType dt = check_float_dtype(kOp, "q", q);
  check_same_dtype(kOp, "k", k, "q", q);
  KEEL_CHECK(dtype_code(positions) == shim_codes().int64, kOp, ": positions must be int64, got ",
             scalar_type_name(positions.scalar_type()));
  KEEL_CHECK(positions.dim() == 1 || positions.dim() == 2, kOp,
             ": positions must be 1-D [num_tokens] or 2-D [batch, seq], got shape ", shape_str(positions));
  KEEL_CHECK(head_size > 0, kOp, ": head_size must be positive, got ", head_size);
  check_dim(kOp, "cos_sin_cache", cos_sin_cache, 2);
  const int64_t rot_dim = cos_sin_cache.size(1);
  KEEL_CHECK(rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= head_size, kOp,
             ": cos_sin_cache must be [max_position, rot_dim] with an even rot_dim <= head_size=", head_size,
             ", got shape ", shape_str(cos_sin_cache));
  const int32_t cache_t = dtype_code(cos_sin_cache);
  KEEL_CHECK(cache_t == shim_codes().float32 || cache_t == dtype_code(q), kOp,
             ": cos_sin_cache must be float32 or the dtype of q (", scalar_type_name(q.scalar_type()), "), got ",
             scalar_type_name(cos_sin_cache.scalar_type()));

  check_no_overlap(kOp, "q", q, "k", k);
  check_no_overlap(kOp, "q", q, "cos_sin_cache", cos_sin_cache);
  check_no_overlap(kOp, "k", k, "cos_sin_cache", cos_sin_cache);
  RotaryParams p{};
  p.dtype = dt;
  p.cache_dtype = cache_t == shim_codes().float32 ? DType::kFloat32 : dt;
  p.q = describe("q", q, positions, head_size);
  p.k = describe("k", k, positions, head_size);
  p.num_tokens = positions.numel();
  p.positions = static_cast<const int64_t*>(positions.data_ptr());
  p.pos_rows = row_layout(kOp, "positions", positions, positions.dim());
  p.cache = cos_sin_cache.data_ptr();
  p.cache_row_stride = cos_sin_cache.stride(0);
  p.cache_col_stride = cos_sin_cache.stride(1);
  p.rot_dim = rot_dim;
  p.is_neox = is_neox;
  p.max_position = cos_sin_cache.size(0);
  if (p.num_tokens == 0) return;

  LaunchContext ctx(q);
#ifdef KEEL_CUDA_LIBRARY
  // Positions stay on the device: the kernel checks them (a device-side assert, no host sync).
  rotary_embedding_cuda(p, ctx.stream());
#else
  const int64_t max_pos = p.max_position;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int64_t pos = p.positions[row_offset(p.pos_rows, t)];
    KEEL_CHECK(pos >= 0 && pos < max_pos, kOp, ": positions[", t, "]=", pos, " is outside cos_sin_cache's ", max_pos,
               " rows");
  }
  const int64_t per_token = (p.q.num_heads + p.k.num_heads) * rot_dim;
  parallel_for(p.num_tokens, grain_for(per_token),
               [&](int64_t b, int64_t e) { cpu::rotary_embedding_tokens(p, b, e); });
#endif
}

}  // namespace keel

KEEL_LIBRARY_IMPL(m) { m.impl("rotary_embedding", TORCH_BOX(&keel::rotary_embedding)); }
