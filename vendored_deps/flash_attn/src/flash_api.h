// vendored_deps/flash_attn/src/flash_api.h
// The fork's public C++ API, shaped as upstream's csrc/flash_attn/flash_api.cpp entry points
// (mha_varlen_fwd, mha_fwd_kvcache): C++ `int` window sizes, `float` scale and softcap, at::Tensor
// replaced by the fork's TensorView (optional arguments: std::optional). The caller allocates
// `out` (contiguous last dim); errors are exceptions naming the argument.
#pragma once

#include <optional>

#include "flash.h"
#include "tensor_view.h"

namespace flash {

// Installs the parallel-for hook (nullptr: serial) and the number of threads it runs on (for
// the split-K heuristic).
void set_parallel_for(ParallelFor fn, int num_threads);

// The CUDA launcher, installed by the CUDA kernels' own translation unit when they are linked in.
using CudaLauncher = void (*)(const Flash_fwd_params& params, void* stream);
void set_cuda_launcher(CudaLauncher fn);

// Caps the CPU kernels at `limit` (the best build this CPU supports is used otherwise).
void set_cpu_isa_limit(CpuIsa limit);

// The CPU build that runs now.
CpuIsa cpu_isa();
const char* cpu_isa_name(CpuIsa isa);

// What the calling thread's last mha_varlen_fwd / mha_fwd_kvcache did along the keys, so a caller
// can see whether split-K ran (upstream FA2 keeps this internal; FA3 reports its split count through
// get_scheduler_metadata): the splits the kernels ran (0 when the call returned before any kernel
// ran, e.g. an empty batch; 1 on CUDA) and the fp32 partials the combine pass merged (num_splits x
// rows x heads; 0 without a split).
struct SplitKvStats {
  int num_splits = 0;
  int64_t partials_combined = 0;
};
SplitKvStats last_splitkv_stats();

// q: [total_q, h, d]; k/v: [total_k, h_k, d], or the paged caches [num_blocks, page_block_size,
// h_k, d] when block_table [b, max_blocks] is given (then seqused_k [b] gives each sequence's
// keys and cu_seqlens_k may be absent); cu_seqlens_q/k: [b + 1] int32; out: like q.
// num_splits: 0 = heuristic, 1 = no split along the keys, n = n splits (CPU only).
// Device tensors (is_cuda): runs the CUDA kernel on `stream`; the index tensors are not read on
// the host: the kernel checks their contents (block ids, lengths) with device-side asserts.
void mha_varlen_fwd(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                    const TensorView& cu_seqlens_q, const std::optional<TensorView>& cu_seqlens_k,
                    const std::optional<TensorView>& seqused_k, const std::optional<TensorView>& block_table,
                    int max_seqlen_q, int max_seqlen_k, float softmax_scale, bool is_causal, int window_size_left,
                    int window_size_right, float softcap, int num_splits, void* stream = nullptr);

// q: [b, seqlen_q, h, d]; kcache/vcache: [num_blocks, page_block_size, h_k, d] with block_table
// [b, max_blocks], or [b, seqlen_k_max, h_k, d] without; seqlens_k: [b] int32 keys per sequence
// (absent: all of the cache); out: like q.
void mha_fwd_kvcache(const TensorView& q, const TensorView& kcache, const TensorView& vcache,
                     const std::optional<TensorView>& seqlens_k, const std::optional<TensorView>& block_table,
                     const TensorView& out, float softmax_scale, bool is_causal, int window_size_left,
                     int window_size_right, float softcap, int num_splits, void* stream = nullptr);

}  // namespace flash
