// vendored_deps/flash_attn/src/cpu/flash_fwd_cpu.h
// The CPU forward kernel, built once per ISA (flash_fwd_cpu.cpp in namespace flash::cpu_<isa>).
#pragma once

#include "../flash.h"

#define FLASH_DECLARE_CPU_ISA(ns) \
  namespace ns {                  \
  void run_mha_fwd(const Flash_fwd_params& params, const CpuRun& run); \
  }

namespace flash {
FLASH_DECLARE_CPU_ISA(cpu_base)
FLASH_DECLARE_CPU_ISA(cpu_avx2)
FLASH_DECLARE_CPU_ISA(cpu_avx512)
}  // namespace flash

#undef FLASH_DECLARE_CPU_ISA
