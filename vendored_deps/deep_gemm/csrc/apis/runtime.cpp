// deep_gemm/csrc/apis/runtime.cpp
// The parallel-for hook, the CPU ISA choice and the CUDA launcher registry (GEMM and casts).
#include "csrc/apis/runtime.hpp"

#include <atomic>

#include "csrc/cuda/launch.hpp"

namespace deep_gemm {
namespace {

void serial_for(int64_t n, int64_t grain, void* ctx, void (*body)(void*, int64_t, int64_t)) {
  (void)grain;
  body(ctx, 0, n);
}

std::atomic<ParallelForFn> g_parallel_for{&serial_for};
std::atomic<int> g_isa_cap{static_cast<int>(CpuIsa::kAVX512)};
std::atomic<cuda::GemmLauncher> g_gemm_launcher{nullptr};
std::atomic<cuda::CastLauncher> g_cast_launcher{nullptr};

CpuIsa best_supported() {
  static const CpuIsa best = [] {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    // every feature the avx512 build is compiled with
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                        __builtin_cpu_supports("avx512bf16");
    return avx512 ? CpuIsa::kAVX512 : avx2 ? CpuIsa::kAVX2 : CpuIsa::kBase;
#else
    return CpuIsa::kBase;
#endif
  }();
  return best;
}

}  // namespace

void set_parallel_for(ParallelForFn fn) { g_parallel_for.store(fn ? fn : &serial_for); }

void parallel_for_raw(int64_t n, int64_t grain, void* ctx, void (*body)(void*, int64_t, int64_t)) {
  g_parallel_for.load()(n, grain, ctx, body);
}

void set_max_cpu_isa(CpuIsa cap) { g_isa_cap.store(static_cast<int>(cap)); }

CpuIsa cpu_isa() {
  const int best = static_cast<int>(best_supported());
  const int cap = g_isa_cap.load();
  return static_cast<CpuIsa>(best < cap ? best : cap);
}

namespace cuda {

bool register_gemm_launcher(GemmLauncher fn) {
  g_gemm_launcher.store(fn);
  return true;
}

GemmLauncher gemm_launcher() { return g_gemm_launcher.load(); }

bool register_cast_launcher(CastLauncher fn) {
  g_cast_launcher.store(fn);
  return true;
}

CastLauncher cast_launcher() { return g_cast_launcher.load(); }

}  // namespace cuda
}  // namespace deep_gemm
