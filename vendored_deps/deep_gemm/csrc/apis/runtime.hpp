// deep_gemm/csrc/apis/runtime.hpp
// Runtime knobs of the CPU path (keel addition; upstream has no CPU path): which vectorized
// build of the kernels runs, capped by the embedding project (keel honours KEEL_CPU_ISA).
#pragma once

#include "csrc/utils/parallel.hpp"

namespace deep_gemm {

enum class CpuIsa : int { kBase = 0, kAVX2 = 1, kAVX512 = 2 };

// Never use a build above `cap` (default: the best this CPU runs).
void set_max_cpu_isa(CpuIsa cap);

// The build the kernels run now: min(cap, what this CPU supports).
CpuIsa cpu_isa();

}  // namespace deep_gemm
