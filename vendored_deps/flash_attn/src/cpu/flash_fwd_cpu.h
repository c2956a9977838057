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

// kv heads per CPU work item: all of them when the item's rows (query positions x heads) fit in
// 256 (decode, short chunks), so every page of the cache is read once; otherwise one.
static inline int cpu_kv_heads_per_item(const Flash_fwd_params& p) { return p.seqlen_q * p.h <= 256 ? p.h_k : 1; }

FLASH_DECLARE_CPU_ISA(cpu_base)
FLASH_DECLARE_CPU_ISA(cpu_avx2)
FLASH_DECLARE_CPU_ISA(cpu_avx512)
}  // namespace flash

#undef FLASH_DECLARE_CPU_ISA
