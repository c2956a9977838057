// deep_gemm/csrc/utils/parallel.hpp
// CPU parallelism hook. The fork owns no thread pool: an embedding project installs its own
// parallel-for once (keel installs torch's pool); the default runs serially.
#pragma once

#include <cstdint>

namespace deep_gemm {

// body(ctx, begin, end) over [0, n) in chunks of at least `grain` items
using ParallelForFn = void (*)(int64_t n, int64_t grain, void* ctx,
                               void (*body)(void* ctx, int64_t begin, int64_t end));

void set_parallel_for(ParallelForFn fn);

// Runs f(begin, end) through the installed hook.
void parallel_for_raw(int64_t n, int64_t grain, void* ctx, void (*body)(void*, int64_t, int64_t));

template <typename F>
inline void parallel_for(int64_t n, int64_t grain, const F& f) {
  if (n <= 0) return;
  if (n <= grain) {
    f(int64_t{0}, n);
    return;
  }
  parallel_for_raw(n, grain, const_cast<F*>(&f),
                   [](void* ctx, int64_t b, int64_t e) { (*static_cast<const F*>(ctx))(b, e); });
}

}  // namespace deep_gemm
