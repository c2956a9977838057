// vendored_deps/flash_attn/src/block_info.h
// Per-sequence geometry shared by the CPU and CUDA kernels (upstream: block_info.h): query / key
// lengths and offsets in varlen, batch or paged mode, the row of key j, and the visible key range
// of query i under the bottom-right aligned causal / window mask.
// Functions are `static` so each ISA build of the CPU kernels keeps its own copy (no ODR mixing
// of differently compiled inline code).
#pragma once

#include <cstdint>

#include "flash.h"

#ifdef __CUDACC__
#define FLASH_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FLASH_HOST_DEVICE inline
#endif

namespace flash {

struct BlockInfo {
  int sq = 0, sk = 0;            // this sequence's queries and keys
  int64_t q_row0 = 0;            // its first row in [total_q] (varlen) or b * seqlen_q (batch mode)
  int64_t q_off = 0, o_off = 0;  // element offsets of its row 0, head 0 in q and out
};

static FLASH_HOST_DEVICE BlockInfo block_info(const Flash_fwd_params& p, int b) {
  BlockInfo s;
  if (p.cu_seqlens_q) {
    s.sq = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
    s.q_row0 = p.cu_seqlens_q[b];
    s.q_off = s.q_row0 * p.q_row_stride;
    s.o_off = s.q_row0 * p.o_row_stride;
  } else {
    s.sq = p.seqlen_q;
    s.q_row0 = int64_t(b) * p.seqlen_q;
    s.q_off = b * p.q_batch_stride;
    s.o_off = b * p.o_batch_stride;
  }
  if (p.seqused_k)
    s.sk = p.seqused_k[b];
  else if (p.cu_seqlens_k)
    s.sk = p.is_seqlens_k_cumulative ? p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b] : p.cu_seqlens_k[b];
  else
    s.sk = p.seqlen_k;
  return s;
}

// Element offset of key row j of sequence b (head 0), in K (is_v false) or V.
static FLASH_HOST_DEVICE int64_t kv_row(const Flash_fwd_params& p, int b, int j, bool is_v) {
  const int64_t row_stride = is_v ? p.v_row_stride : p.k_row_stride;
  const int64_t batch_stride = is_v ? p.v_batch_stride : p.k_batch_stride;
  if (p.block_table) {
    const int block = p.block_table[b * p.block_table_batch_stride + j / p.page_block_size];
    return block * batch_stride + int64_t(j % p.page_block_size) * row_stride;
  }
  if (p.cu_seqlens_k && p.is_seqlens_k_cumulative) return (int64_t(p.cu_seqlens_k[b]) + j) * row_stride;
  return b * batch_stride + int64_t(j) * row_stride;
}

// Keys [lo, hi) that query i sees: j <= i + sk - sq + right and j >= i + sk - sq - left
// (negative: unbounded; causal: right = 0).
struct KeyRange {
  int lo, hi;
};

static FLASH_HOST_DEVICE KeyRange visible_keys(const Flash_fwd_params& p, const BlockInfo& s, int i) {
  const int diag = i + s.sk - s.sq;
  const int left = p.window_size_left, right = p.is_causal ? 0 : p.window_size_right;
  KeyRange r{0, s.sk};
  if (left >= 0 && diag - left > 0) r.lo = diag - left;
  if (right >= 0 && diag + right + 1 < s.sk) r.hi = diag + right + 1;
  return r;
}

}  // namespace flash
