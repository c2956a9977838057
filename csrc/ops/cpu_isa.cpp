// keel/csrc/ops/cpu_isa.cpp
// Runtime choice between the baseline and AVX2 builds of the CPU kernels.
#include "ops/cpu_isa.h"

#include <cstdlib>

namespace keel {

bool cpu_has_avx2() {
  // KEEL_CPU_ISA=base forces the baseline kernels (for tests and comparisons).
  static const bool has = [] {
    const char* forced = std::getenv("KEEL_CPU_ISA");
    if (forced && forced[0] == 'b') return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
  }();
  return has;
}

}  // namespace keel
