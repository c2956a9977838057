// vendored_deps/flash_attn/src/flash.h
// The forward parameters, named as upstream flash-attention names them (csrc/flash_attn/src/flash.h:
// Qkv_params + Flash_fwd_params), restricted to what this fork implements. Strides are in elements.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "tensor_view.h"

// Errors are C++ exceptions with the argument named; an embedding project may route them by
// defining FLASH_CHECK before including this header (as DeepGEMM allows for its macros).
#ifndef FLASH_CHECK
#define FLASH_CHECK(cond, msg)                                          \
  do {                                                                  \
    if (__builtin_expect(!(cond), 0)) throw std::invalid_argument(msg); \
  } while (0)
#endif

namespace flash {

struct Qkv_params {
  using index_t = int64_t;
  void* __restrict__ q_ptr = nullptr;
  void* __restrict__ k_ptr = nullptr;
  void* __restrict__ v_ptr = nullptr;
  // batch mode: q_batch_stride between sequences; paged K/V: k_batch_stride is the block stride
  index_t q_batch_stride = 0, k_batch_stride = 0, v_batch_stride = 0;
  index_t q_row_stride = 0, k_row_stride = 0, v_row_stride = 0;
  index_t q_head_stride = 0, k_head_stride = 0, v_head_stride = 0;
  int h = 0, h_k = 0;
  int h_h_k_ratio = 1;  // h / h_k: query heads per kv head (GQA / MQA)
};

struct Flash_fwd_params : public Qkv_params {
  void* __restrict__ o_ptr = nullptr;
  void* __restrict__ oaccum_ptr = nullptr;  // fp32 [num_splits, total_q, h, d] when split along K
  index_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  void* __restrict__ softmax_lseaccum_ptr = nullptr;  // fp32 [num_splits, total_q, h]

  int b = 0;         // batch size (number of sequences)
  int seqlen_q = 0;  // batch mode: every sequence's query length; varlen: max_seqlen_q
  int seqlen_k = 0;  // max keys of a sequence (varlen: max_seqlen_k; paged: the block table's capacity)
  int d = 0;         // head dim
  int total_q = 0;   // rows of q (varlen: total tokens; batch mode: b * seqlen_q)

  float scale_softmax = 0.f;  // applied to q.k (when softcap > 0: after the tanh, see softcap)
  float softcap = 0.f;        // upstream's convention: softmax_scale / softcap when softcapping, else 0

  int* __restrict__ cu_seqlens_q = nullptr;  // [b + 1] int32 (varlen), nullptr in batch mode
  int* __restrict__ cu_seqlens_k = nullptr;  // [b + 1] cumulative, or [b] per-sequence lengths
  int* __restrict__ seqused_k = nullptr;     // [b] int32: keys used per sequence (overrides cu_seqlens_k)
  bool is_seqlens_k_cumulative = true;

  int* __restrict__ block_table = nullptr;  // [b, max_blocks] int32: K/V are paged when set
  index_t block_table_batch_stride = 0;
  int page_block_size = 0;
  int num_blocks = 0;              // blocks in the paged cache (for the range check)
  int max_num_blocks_per_seq = 0;  // columns of block_table (keel addition: the CUDA kernel's range check)
  int total_k = 0;                 // rows of k in unpaged varlen mode (keel addition: the same)

  int window_size_left = -1, window_size_right = -1;  // -1: unbounded
  bool is_causal = false;
  DType dtype = DType::kOther;  // of q, k, v, out
  bool is_bf16 = false;

  int num_splits = 1;  // split along the keys, combined at the end (split-K)
};

// The parallel-for hook: body(ctx, begin, end) over [0, n) in chunks of at least `grain`.
// The embedding project installs its thread pool's; the default runs serially.
using ParallelBody = void (*)(void* ctx, int64_t begin, int64_t end);
using ParallelFor = void (*)(int64_t n, int64_t grain, void* ctx, ParallelBody body);

// CPU builds of the kernels, best last; the fork picks the best this CPU runs, capped by the
// embedding project's limit (keel's adapter honours KEEL_CPU_ISA).
enum class CpuIsa { kBase = 0, kAvx2 = 1, kAvx512 = 2 };

struct CpuRun {
  ParallelFor parallel_for = nullptr;
  int num_threads = 1;
};

}  // namespace flash
