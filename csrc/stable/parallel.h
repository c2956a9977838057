// keel/csrc/stable/parallel.h
// CPU parallelism through torch's own thread pool (torch_parallel_for), so keel
// never brings a second OpenMP runtime into the process.
#pragma once

#include <cstdint>

#include <torch/csrc/stable/ops.h>

namespace keel {

// Runs f(begin, end) over [0, n) in chunks of at least `grain` items on torch's pool.
// Runs inline when the work is small (saves the pool hand-off on tiny tensors).
template <typename F>
inline void parallel_for(int64_t n, int64_t grain, const F& f) {
  if (n <= 0) return;
  if (n <= grain) {
    f(int64_t{0}, n);
    return;
  }
  torch::stable::parallel_for(0, n, grain, f);
}

}  // namespace keel
