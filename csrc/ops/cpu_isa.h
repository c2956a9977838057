// keel/csrc/ops/cpu_isa.h
// CPU kernels (csrc/ops/*_cpu.cpp) are compiled twice: baseline x86-64 and AVX2+FMA+F16C.
// Each kernel file defines its row functions inside KEEL_CPU_NS; the op wrapper asks
// keel::cpu_has_avx2() once and calls the matching namespace.
#pragma once

#ifndef KEEL_CPU_NS
#define KEEL_CPU_NS cpu_base
#endif

namespace keel {

// True when this CPU runs the AVX2 build of the kernels (AVX2, FMA and F16C present).
bool cpu_has_avx2();

// True when the AVX2 build may also use AVX512-BF16 instructions (keel::linear's bf16 GEMV).
bool cpu_has_avx512bf16();

// True when the AVX2 build may also use AVX512F/BW/VL/DQ instructions (keel::fp8_linear's e4m3 GEMV).
bool cpu_has_avx512();

// True when the AVX2 build may also run AMX tiles (amx_tile + amx_bf16, on top of AVX-512 BF16) and Linux
// granted this process the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, asked once per process): the
// bf16 prompt GEMMs of keel::linear and keel::fp8_linear. KEEL_CPU_ISA=avx512 (or lower) turns it off;
// KEEL_CPU_ISA=amx makes a missing AMX an error (std::runtime_error naming the reason) instead of false.
// Every cpu_has_* throws std::runtime_error for an unknown KEEL_CPU_ISA (stable/cpu_isa_level.h).
bool cpu_has_amx();

#if defined(__AVX2__)
// The AVX2 build's AVX-512 variant of a plain loop: the same source vectorized 16 floats wide, with 32
// registers (the 8-wide build of a long loop body spills). Called only when cpu_has_avx512().
#define KEEL_AVX512_WIDE __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512")))
#endif

// Declares `fn(params, begin, end)` in both ISA namespaces plus a dispatcher keel::cpu::fn.
#define KEEL_DECLARE_CPU_KERNEL(fn, Params)                     \
  namespace cpu_base {                                          \
  void fn(const Params& p, int64_t begin, int64_t end);         \
  }                                                             \
  namespace cpu_avx2 {                                          \
  void fn(const Params& p, int64_t begin, int64_t end);         \
  }                                                             \
  namespace cpu {                                               \
  inline void fn(const Params& p, int64_t begin, int64_t end) { \
    if (cpu_has_avx2()) {                                       \
      cpu_avx2::fn(p, begin, end);                              \
    } else {                                                    \
      cpu_base::fn(p, begin, end);                              \
    }                                                           \
  }                                                             \
  }

}  // namespace keel
