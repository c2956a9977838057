// adapters/flash_attn/bindings.cpp
// Every schema of keel_flash_attn, in one place. Upstream's C++ takes `int window_size_left/right`
// and `float softmax_scale/softcap` (Python: window_size=(left, right)); the stable dispatcher
// carries neither tuples nor narrow types, so the schemas split the window into two ints and
// widen to int (int64) / float (double); the adapter narrows back with range checks.
#include "stable/library.h"

STABLE_TORCH_LIBRARY(keel_flash_attn, m) {
  // upstream mha_varlen_fwd: packed q [total_q, H, D], k/v [total_k, H_kv, D] or paged caches
  // [num_blocks, block_size, H_kv, D] with block_table [B, max_blocks] + seqused_k [B] -> [total_q, H, D]
  m.def(
      "varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor? cu_seqlens_k, Tensor? seqused_k, "
      "Tensor? block_table, int max_seqlen_q, int max_seqlen_k, float softmax_scale, bool causal, int window_left, "
      "int window_right, float softcap, int num_splits) -> Tensor");
  // upstream mha_fwd_kvcache (without appending k/v): q [B, S_q, H, D] against a paged cache
  // [num_blocks, block_size, H_kv, D] (block_table [B, max_blocks]) or a dense one [B, S_k, H_kv, D]
  m.def(
      "fwd_kvcache(Tensor q, Tensor k_cache, Tensor v_cache, Tensor? cache_seqlens, Tensor? block_table, "
      "float softmax_scale, bool causal, int window_left, int window_right, float softcap, int num_splits) -> Tensor");
  // the CPU build the kernels run now (0 base, 1 avx2, 2 avx512); `probe` picks the CPU library
  m.def("cpu_isa(Tensor probe) -> int");
  // what this thread's last varlen_fwd / fwd_kvcache did along the keys (CPU kernels): (num_splits ran,
  // fp32 partials the split-K combine merged); (0, 0) when it returned before any kernel ran
  m.def("last_splitkv_stats(Tensor probe) -> (int, int)");
}
