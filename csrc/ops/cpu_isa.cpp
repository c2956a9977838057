// keel/csrc/ops/cpu_isa.cpp
// Runtime choice between the baseline and AVX2 builds of the CPU kernels.
#include "ops/cpu_isa.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace keel {
namespace {

// KEEL_CPU_ISA: unset, "" or "auto" = the best this CPU runs; "base" = baseline x86-64;
// "avx2" = AVX2 without AVX512 extras (for tests and comparisons). Anything else is refused
// (keel's Python package refuses it at import already; this guards a direct library load).
enum class Forced { kAuto, kBase, kAvx2 };

Forced forced_isa() {
  static const Forced f = [] {
    const char* v = std::getenv("KEEL_CPU_ISA");
    if (v == nullptr || *v == '\0' || std::strcmp(v, "auto") == 0) return Forced::kAuto;
    if (std::strcmp(v, "base") == 0) return Forced::kBase;
    if (std::strcmp(v, "avx2") == 0) return Forced::kAvx2;
    throw std::runtime_error(std::string("keel: KEEL_CPU_ISA='") + v +
                             "' is not a known instruction set; expected one of auto, base, avx2 (or unset)");
  }();
  return f;
}

}  // namespace

bool cpu_has_avx2() {
  static const bool has = [] {
    if (forced_isa() == Forced::kBase) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  }();
  return has;
}

bool cpu_has_avx512bf16() {
  // only on top of the AVX2 build; KEEL_CPU_ISA=avx2 (or base) turns it off
  static const bool has = [] {
    if (!cpu_has_avx2() || forced_isa() == Forced::kAvx2) return false;
    return __builtin_cpu_supports("avx512bf16") != 0;
  }();
  return has;
}

bool cpu_has_avx512() {
  // only on top of the AVX2 build; KEEL_CPU_ISA=avx2 (or base) turns it off
  static const bool has = [] {
    if (!cpu_has_avx2() || forced_isa() == Forced::kAvx2) return false;
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }();
  return has;
}

}  // namespace keel
