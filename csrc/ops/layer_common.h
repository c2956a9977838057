// keel/csrc/ops/layer_common.h
// What keel::layer_qkv and keel::layer_mlp share: buffers for their intermediates (CPU: per-thread buffers kept
// between calls, no allocation per call; CUDA: tensors of the call) and the launch of each row kernel (the kernels of
// keel::rms_norm, rotary_embedding, reshape_and_cache and silu_and_mul, with the same parameters those ops pass, so
// the same bits) on the library's device.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/reshape_and_cache.h"
#include "ops/rms_norm.h"
#include "ops/rotary_embedding.h"
#include "ops/silu_and_mul.h"
#include "stable/alloc.h"
#include "stable/device.h"
#include "stable/parallel.h"

namespace keel {

// Every slot in [-1, capacity) and none twice (defined in reshape_and_cache.cpp; errors name `op`).
void check_cache_slots(const char* op, const ReshapeAndCacheParams& p, int64_t capacity);

namespace layer {

inline int64_t element_size(DType dt) { return dt == DType::kFloat32 ? 4 : 2; }

// Row-major [rows, cols] intermediates of dtype dt, one per slot (each live intermediate has its own).
class Scratch {
 public:
  Scratch(DType dt, int32_t dt_code, const Tensor& like) : dt_(dt), code_(dt_code), like_(like) {}

  void* get(int slot, int64_t rows, int64_t cols) {
#ifdef KEEL_CUDA_LIBRARY
    tensors_[slot] = empty_contiguous({rows, cols}, code_, like_);
    return tensors_[slot].data_ptr();
#else
    thread_local std::vector<uint64_t> bufs[kSlots];  // 8-byte elements: aligned for every dtype
    std::vector<uint64_t>& b = bufs[slot];
    const size_t words = static_cast<size_t>((rows * cols * element_size(dt_) + 7) / 8);
    if (b.size() < words) b.resize(words);
    return b.data();
#endif
  }
#ifdef KEEL_CUDA_LIBRARY
  const Tensor& tensor(int slot) const { return tensors_[slot]; }
  void set(int slot, Tensor t) { tensors_[slot] = std::move(t); }
#endif

  static constexpr int kSlots = 4;

 private:
  DType dt_;
  int32_t code_;
  const Tensor& like_;
#ifdef KEEL_CUDA_LIBRARY
  Tensor tensors_[kSlots];
#endif
};

// Contiguous rows [rows, cols] starting at `data` as a RowLayout of one dimension.
inline RowLayout rows_of(int64_t rows, int64_t row_stride) {
  RowLayout l;
  l.ndim = 1;
  l.sizes[0] = rows;
  l.strides[0] = row_stride;
  return l;
}

inline void rms_norm(const RmsNormParams& p, const LaunchContext& ctx) {
  if (p.rows == 0 || p.hidden == 0) return;
#ifdef KEEL_CUDA_LIBRARY
  rms_norm_cuda(p, ctx.stream());
#else
  (void)ctx;
  parallel_for(p.rows, grain_for(p.hidden), [&](int64_t b, int64_t e) { cpu::rms_norm_rows(p, b, e); });
#endif
}

inline void rotary(const RotaryParams& p, const LaunchContext& ctx) {
  if (p.num_tokens == 0) return;
#ifdef KEEL_CUDA_LIBRARY
  rotary_embedding_cuda(p, ctx.stream());
#else
  (void)ctx;
  const int64_t per_token = (p.q.num_heads + p.k.num_heads) * p.rot_dim;
  parallel_for(p.num_tokens, grain_for(per_token),
               [&](int64_t b, int64_t e) { cpu::rotary_embedding_tokens(p, b, e); });
#endif
}

inline void cache_write(const ReshapeAndCacheParams& p, const LaunchContext& ctx) {
  if (p.num_tokens == 0) return;
#ifdef KEEL_CUDA_LIBRARY
  reshape_and_cache_cuda(p, ctx.stream());
#else
  (void)ctx;
  parallel_for(p.num_tokens, grain_for(2 * p.kv_heads * p.head_size, 32768),
               [&](int64_t b, int64_t e) { cpu::reshape_and_cache_tokens(p, b, e); });
#endif
}

inline void silu_and_mul(const SiluAndMulParams& p, const LaunchContext& ctx) {
  if (p.rows == 0 || p.d == 0) return;
#ifdef KEEL_CUDA_LIBRARY
  silu_and_mul_cuda(p, ctx.stream());
#else
  (void)ctx;
  parallel_for(p.rows, grain_for(p.d, 32768), [&](int64_t b, int64_t e) { cpu::silu_and_mul_rows(p, b, e); });
#endif
}

}  // namespace layer
}  // namespace keel
