// keel/csrc/ops/cpu_isa.cpp
// Runtime choice between the baseline and AVX2 builds of the CPU kernels, and of the AVX-512 and AMX
// extras inside the AVX2 build, capped by KEEL_CPU_ISA (read by stable/cpu_isa_level.h, the one reader
// every library shares). Also the library's answer to "what runs here, and why no AMX" for Python
// (keel_cpu_isa_status: codes, never a message to parse).
#include "ops/cpu_isa.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

#include "stable/cpu_isa_level.h"

namespace keel {
namespace {

// Why the AMX prompt kernels do not run (0: they do). The codes are part of keel_cpu_isa_status's answer;
// keel_amx_reason_text gives the library's words for each (src/keel/_native.py cpu_isa_status reads both).
enum AmxReason : int {
  kAmxUsable = 0,
  kAmxCapped = 1,          // KEEL_CPU_ISA is base, avx2 or avx512
  kAmxNoAvx512 = 2,        // the AVX2 build's AVX-512 extras (F/BW/VL/DQ/BF16) are off or missing
  kAmxNoCpuidLeaf7 = 3,    // CPUID leaf 7 is not available
  kAmxNoTiles = 4,         // CPUID.7.0:EDX lacks amx_tile (bit 24) or amx_bf16 (bit 22)
  kAmxNoAvx512Bf16 = 5,    // the AMX kernels' helpers use AVX-512 BF16
  kAmxPermRefused = 6,     // arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) failed (errno kept)
  kAmxPermNotGranted = 7,  // arch_prctl(ARCH_GET_XCOMP_PERM) does not report the tile data state
};

const char* amx_reason_text(int code) {
  switch (code) {
    case kAmxUsable:
      return "usable";
    case kAmxCapped:
      return "capped by KEEL_CPU_ISA";
    case kAmxNoAvx512:
      return "this CPU lacks AVX-512 (F/BW/VL/DQ/BF16)";
    case kAmxNoCpuidLeaf7:
      return "CPUID leaf 7 is not available";
    case kAmxNoTiles:
      return "this CPU lacks amx_tile/amx_bf16 (CPUID.7.0:EDX bits 24/22)";
    case kAmxNoAvx512Bf16:
      return "this CPU lacks avx512bf16 (the AMX kernels' helpers use it)";
    case kAmxPermRefused:
      return "the kernel refused arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)";
    case kAmxPermNotGranted:
      return "arch_prctl(ARCH_GET_XCOMP_PERM) does not report XFEATURE_XTILEDATA as granted";
    default:
      return nullptr;
  }
}

bool avx512_allowed() { return cpu_isa_level() >= CpuIsaLevel::kAvx512; }

// Linux gives a process the AMX tile data state only on request (arch_prctl ARCH_REQ_XCOMP_PERM,
// XFEATURE_XTILEDATA); without it the first tile instruction faults.
constexpr int kArchGetXcompPerm = 0x1022;
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

struct AmxState {
  int reason = kAmxUsable;
  int error = 0;  // errno of a refused arch_prctl
};

AmxState probe_amx() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return {kAmxNoCpuidLeaf7};
  const bool amx_bf16 = (d >> 22) & 1u, amx_tile = (d >> 24) & 1u;
  if (!amx_tile || !amx_bf16) return {kAmxNoTiles};
  if (!__builtin_cpu_supports("avx512bf16")) return {kAmxNoAvx512Bf16};
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return {kAmxPermRefused, errno};
  unsigned long mask = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &mask) != 0 || !((mask >> kXfeatureXtiledata) & 1ul)) {
    return {kAmxPermNotGranted};
  }
  return {};
}

// once per process (a function-local static: thread-safe); the permission is process-wide
const AmxState& amx_state() {
  static const AmxState s = [] {
    if (cpu_isa_level() < CpuIsaLevel::kAmx) return AmxState{kAmxCapped};
    if (!cpu_has_avx512bf16() || !cpu_has_avx512()) return AmxState{kAmxNoAvx512};
    return probe_amx();
  }();
  return s;
}

std::string amx_reason_message(const AmxState& s) {
  std::string m = amx_reason_text(s.reason);
  if (s.reason == kAmxPermRefused) m += std::string(": ") + std::strerror(s.error);
  return m;
}

}  // namespace

bool cpu_has_avx2() {
  static const bool has = [] {
    if (cpu_isa_level() == CpuIsaLevel::kBase) return false;
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
  const AmxState& s = amx_state();
  if (s.reason == kAmxUsable) return true;
  if (cpu_isa_level() == CpuIsaLevel::kAmx) {
    throw std::runtime_error("keel: KEEL_CPU_ISA=amx, but AMX is not usable in this process: " + amx_reason_message(s));
  }
  return false;
}

}  // namespace keel

// ---- the library's answer for Python (ctypes, src/keel/_native.py cpu_isa_status); C linkage, never throws ----

extern "C" {

// Fills `out[4]`: the KEEL_CPU_ISA level (0 base, 1 avx2, 2 avx512, 3 amx, 4 auto), what keel's CPU kernels run
// (bit 0 the AVX2 build, bit 1 AVX-512 F/BW/VL/DQ, bit 2 AVX-512 BF16, bit 3 the AMX prompt kernels), the
// AMX reason code (0 usable; keel_amx_reason_text names each) and the errno of a refused arch_prctl.
// Returns 0, or -1 (out untouched) when KEEL_CPU_ISA is not a known level. Asks for the AMX permission, as the
// first prompt GEMM would.
__attribute__((visibility("default"))) int keel_cpu_isa_status(int* out) {
  const keel::CpuIsaSetting& s = keel::cpu_isa_setting();
  if (!s.valid) return -1;
  const keel::AmxState& amx = keel::amx_state();
  out[0] = static_cast<int>(s.level);
  out[1] = (keel::cpu_has_avx2() ? 1 : 0) | (keel::cpu_has_avx512() ? 2 : 0) | (keel::cpu_has_avx512bf16() ? 4 : 0) |
           (amx.reason == keel::kAmxUsable ? 8 : 0);
  out[2] = amx.reason;
  out[3] = amx.error;
  return 0;
}

// The words for an AMX reason code of keel_cpu_isa_status; nullptr for an unknown code.
__attribute__((visibility("default"))) const char* keel_amx_reason_text(int code) {
  return keel::amx_reason_text(code);
}

}  // extern "C"
