// keel/csrc/stable/cpu_isa_level.h
// KEEL_CPU_ISA, read in one place for every library keel builds: keel's own ops (csrc/ops/cpu_isa.cpp)
// and each adapter, which passes the level into its vendored fork as a plain value (the forks include
// nothing of keel). keel's Python package validates the same variable before any library loads
// (src/keel/_settings.py); this guards a direct library load. Torch-free.
//
// The levels cap what runs, they never enable what the CPU lacks; what each level runs in every library
// is the one table in docs/ops.md (KEEL_CPU_ISA):
//   auto (or unset, or "")  the best this CPU runs; AMX prompt kernels when usable, silently without
//   base                    baseline x86-64 everywhere
//   avx2                    AVX2+FMA+F16C, no AVX-512
//   avx512                  AVX-512 (BF16 included) where the CPU has it, no AMX
//   amx                     as auto, but keel's bf16 prompt GEMMs require AMX (an error where unusable);
//                           the vendored forks have no AMX kernels and run their best (AVX-512) build
#pragma once

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace keel {

// Ordered by how much they allow: a level's cap is its value; kAuto caps nothing (as kAmx, without requiring it).
enum class CpuIsaLevel : int { kBase = 0, kAvx2 = 1, kAvx512 = 2, kAmx = 3, kAuto = 4 };

inline constexpr const char* kCpuIsaLevels = "auto, base, avx2, avx512, amx";

// What KEEL_CPU_ISA says: `valid` false for a value that is none of the levels (`raw` holds it).
struct CpuIsaSetting {
  bool valid = true;
  CpuIsaLevel level = CpuIsaLevel::kAuto;
  std::string raw;
};

// The parser: nullptr, "" and "auto" are kAuto.
inline CpuIsaSetting parse_cpu_isa(const char* v) {
  CpuIsaSetting s;
  if (v == nullptr || *v == '\0') return s;
  s.raw = v;
  static constexpr struct {
    const char* name;
    CpuIsaLevel level;
  } kNames[] = {{"auto", CpuIsaLevel::kAuto},
                {"base", CpuIsaLevel::kBase},
                {"avx2", CpuIsaLevel::kAvx2},
                {"avx512", CpuIsaLevel::kAvx512},
                {"amx", CpuIsaLevel::kAmx}};
  for (const auto& n : kNames) {
    if (std::strcmp(v, n.name) == 0) {
      s.level = n.level;
      return s;
    }
  }
  s.valid = false;
  return s;
}

// This process's KEEL_CPU_ISA, read once per library (the first call); a later change of the environment
// is not seen, as in keel's Python package.
inline const CpuIsaSetting& cpu_isa_setting() {
  static const CpuIsaSetting s = parse_cpu_isa(std::getenv("KEEL_CPU_ISA"));
  return s;
}

// The level; an unknown value throws std::runtime_error naming KEEL_CPU_ISA and the levels.
inline CpuIsaLevel cpu_isa_level() {
  const CpuIsaSetting& s = cpu_isa_setting();
  if (!s.valid) {
    throw std::runtime_error("keel: KEEL_CPU_ISA='" + s.raw +
                             "' is not a known CPU instruction-set level; expected one of " + kCpuIsaLevels +
                             " (or unset for auto)");
  }
  return s.level;
}

// The cap as a plain number for a vendored fork: 0 base, 1 avx2, 2 avx512, 3 amx (auto caps nothing: 3).
// A fork clamps it to its best build (min(cap, its AVX-512 value)); no fork has AMX kernels.
inline int cpu_isa_cap() {
  const CpuIsaLevel l = cpu_isa_level();
  return l == CpuIsaLevel::kAuto ? static_cast<int>(CpuIsaLevel::kAmx) : static_cast<int>(l);
}

}  // namespace keel
