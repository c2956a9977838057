// keel/csrc/ops/rotary_embedding.h
// In-place rotary position embedding of q and k (vLLM layout): for each token t and
// head, the first rot_dim elements are rotated by cos_sin_cache[positions[t]].
//   NeoX (is_neox): pairs (i, i + rot_dim/2);  GPT-J: pairs (2i, 2i + 1)
#pragma once

#include <cstdint>

#include "ops/cpu_isa.h"
#include "stable/kernel_types.h"

namespace keel {

struct RotaryTensor {
  void* data;
  RowLayout tokens;  // token index -> offset of the token's first head
  int64_t head_stride;
  int64_t elem_stride;
  int64_t num_heads;
};

struct RotaryParams {
  DType dtype;               // of q and k
  DType cache_dtype;         // of cos_sin_cache (float32 or the dtype of q)
  const int64_t* positions;  // int64 positions, token index -> via pos_rows
  RowLayout pos_rows;
  RotaryTensor q;
  RotaryTensor k;
  const void* cache;  // [max_position, rot_dim]: cos in [:rot_dim/2], sin in [rot_dim/2:]
  int64_t cache_row_stride;
  int64_t cache_col_stride;
  int64_t rot_dim;
  int64_t num_tokens;
  int64_t max_position;  // rows of cos_sin_cache: positions must be in [0, max_position)
  bool is_neox;
};

KEEL_DECLARE_CPU_KERNEL(rotary_embedding_tokens, RotaryParams)

// Launches on `stream` (a cudaStream_t). Defined in rotary_embedding.cu.
void rotary_embedding_cuda(const RotaryParams& p, void* stream);

}  // namespace keel
