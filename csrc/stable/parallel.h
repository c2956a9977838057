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

// Items per parallel chunk so each chunk does at least `target` units of work, where one
// item (row, token) costs `work_per_item` units: small rows are batched, large rows go alone.
inline int64_t grain_for(int64_t work_per_item, int64_t target = 16384) {
  return work_per_item >= target ? 1 : target / (work_per_item > 0 ? work_per_item : 1);
}

}  // namespace keel
