// vendored_deps/flash_attn/src/cpu/flash_fwd_cpu.h
// The CPU forward kernel, built once per ISA (flash_fwd_cpu.cpp in namespace flash::cpu_<isa>).
#pragma once

#include "../flash.h"

// run_mha_fwd returns the fp32 partials its split-K combine pass merged (0 without a split).
#define FLASH_DECLARE_CPU_ISA(ns)                                         \
  namespace ns {                                                          \
  int64_t run_mha_fwd(const Flash_fwd_params& params, const CpuRun& run); \
  }

namespace flash {

// Query positions per CPU work item: about 64 rows (query positions x the heads of a group), K/V rows being
// reused that often, and at most 256 rows.
static inline int cpu_block_m(const Flash_fwd_params& p) {
  const int g = p.h_h_k_ratio > 1 ? p.h_h_k_ratio : 1;
  const int bm = p.seqlen_q < 64 / g ? p.seqlen_q : 64 / g;
  const int cap = 256 / g > 1 ? 256 / g : 1;
  return bm < 1 ? 1 : (bm < cap ? bm : cap);
}

// kv heads per CPU work item: all of them when the item's rows (query positions x heads) fit in 256 (decode,
// short chunks), so every page of the cache is read once, unless that leaves fewer items than threads: then the
// largest divisor of h_k that gives every thread an item. The work spreads over the kv heads, not along the keys:
// a key split (split-K) merges partial softmaxes, which changes a query's bits with the split count (a
// query's output must not depend on the call, the batch or the thread count), so the CPU splits only when asked.
// A query row's arithmetic does not depend on which kv heads share its item.
static inline int cpu_kv_heads_per_item(const Flash_fwd_params& p, int num_threads) {
  if (p.seqlen_q * p.h > 256) return 1;
  const int bm = cpu_block_m(p);
  const int64_t other = int64_t(p.b) * ((p.seqlen_q + bm - 1) / bm) * (p.num_splits > 1 ? p.num_splits : 1);
  for (int g = p.h_k; g > 1; --g) {
    if (p.h_k % g == 0 && other * (p.h_k / g) >= num_threads) return g;
  }
  return 1;
}

FLASH_DECLARE_CPU_ISA(cpu_base)
FLASH_DECLARE_CPU_ISA(cpu_avx2)
FLASH_DECLARE_CPU_ISA(cpu_avx512)
}  // namespace flash

#undef FLASH_DECLARE_CPU_ISA
