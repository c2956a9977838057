// keel/csrc/ops/cpu_isa.cpp
// Runtime choice between the baseline and AVX2 builds of the CPU kernels.
#include "ops/cpu_isa.h"

#include <cstdlib>
#include <cstring>

namespace keel {

bool cpu_has_avx2() {
  // KEEL_CPU_ISA=base forces the baseline kernels, =avx2 the AVX2 ones without AVX512 extras
  // (for tests and comparisons); unset or anything else: the best this CPU runs.
  static const bool has = [] {
    const char* forced = std::getenv("KEEL_CPU_ISA");
    if (forced && std::strcmp(forced, "base") == 0) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
  }();
  return has;
}

bool cpu_has_avx512bf16() {
  // only on top of the AVX2 build; KEEL_CPU_ISA=avx2 (or base) turns it off
  static const bool has = [] {
    const char* forced = std::getenv("KEEL_CPU_ISA");
    if (!cpu_has_avx2() || (forced && std::strcmp(forced, "avx2") == 0)) return false;
    return __builtin_cpu_supports("avx512bf16") != 0;
  }();
  return has;
}

}  // namespace keel
