// keel/csrc/ops/cpu_isa.cpp
// Runtime choice between the baseline and AVX2 builds of the CPU kernels, and of the AVX-512 and AMX
// extras inside the AVX2 build.
#include "ops/cpu_isa.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace keel {
namespace {

// KEEL_CPU_ISA: unset, "" or "auto" = the best this CPU runs; "base" = baseline x86-64;
// "avx2" = AVX2 without AVX-512 extras; "avx512" = AVX-512 (BF16 included) without AMX; "amx" = the
// AMX prompt kernels, required: a CPU or kernel without usable AMX is an error at the first keel::linear
// or keel::fp8_linear call that would take them (auto silently goes without). The levels cap what
// runs, they never enable what the CPU lacks. Anything else is refused (keel's Python package refuses
// it at import already; this guards a direct library load).
enum class Forced { kAuto, kBase, kAvx2, kAvx512, kAmx };

Forced forced_isa() {
  static const Forced f = [] {
    const char* v = std::getenv("KEEL_CPU_ISA");
    if (v == nullptr || *v == '\0' || std::strcmp(v, "auto") == 0) return Forced::kAuto;
    if (std::strcmp(v, "base") == 0) return Forced::kBase;
    if (std::strcmp(v, "avx2") == 0) return Forced::kAvx2;
    if (std::strcmp(v, "avx512") == 0) return Forced::kAvx512;
    if (std::strcmp(v, "amx") == 0) return Forced::kAmx;
    throw std::runtime_error(std::string("keel: KEEL_CPU_ISA='") + v +
                             "' is not a known instruction set; expected one of auto, base, avx2, avx512, amx "
                             "(or unset)");
  }();
  return f;
}

bool avx512_allowed() { return forced_isa() != Forced::kBase && forced_isa() != Forced::kAvx2; }

// Linux gives a process the AMX tile data state only on request (arch_prctl ARCH_REQ_XCOMP_PERM,
// XFEATURE_XTILEDATA); without it the first tile instruction faults. Empty string: granted.
constexpr int kArchGetXcompPerm = 0x1022;
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

std::string amx_unusable_reason() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return "CPUID leaf 7 is not available";
  const bool amx_bf16 = (d >> 22) & 1u, amx_tile = (d >> 24) & 1u;
  if (!amx_tile || !amx_bf16) return "this CPU lacks amx_tile/amx_bf16 (CPUID.7.0:EDX bits 24/22)";
  if (!__builtin_cpu_supports("avx512bf16")) return "this CPU lacks avx512bf16 (the AMX kernels' helpers use it)";
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
    return std::string("the kernel refused arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): ") +
           std::strerror(errno);
  }
  unsigned long mask = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &mask) != 0 || !((mask >> kXfeatureXtiledata) & 1ul)) {
    return "arch_prctl(ARCH_GET_XCOMP_PERM) does not report XFEATURE_XTILEDATA as granted";
  }
  return "";
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
    if (!cpu_has_avx2() || !avx512_allowed()) return false;
    return __builtin_cpu_supports("avx512bf16") != 0;
  }();
  return has;
}

bool cpu_has_avx512() {
  // only on top of the AVX2 build; KEEL_CPU_ISA=avx2 (or base) turns it off
  static const bool has = [] {
    if (!cpu_has_avx2() || !avx512_allowed()) return false;
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }();
  return has;
}

bool cpu_has_amx() {
  // once per process (a function-local static: thread-safe); the permission is process-wide
  static const std::string reason = [] {
    if (forced_isa() != Forced::kAuto && forced_isa() != Forced::kAmx) return std::string("capped by KEEL_CPU_ISA");
    if (!cpu_has_avx512bf16() || !cpu_has_avx512()) return std::string("this CPU lacks AVX-512 (F/BW/VL/DQ/BF16)");
    return amx_unusable_reason();
  }();
  if (reason.empty()) return true;
  if (forced_isa() == Forced::kAmx) {
    throw std::runtime_error("keel: KEEL_CPU_ISA=amx, but AMX is not usable in this process: " + reason);
  }
  return false;
}

}  // namespace keel
