// keel/csrc/stable/parallel.h
// CPU parallelism through torch's own thread pool (torch_parallel_for), so keel
// never brings a second OpenMP runtime into the process.
#pragma once

#include <algorithm>
#include <atomic>
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

// Runs f(begin, end) over [0, n) in chunks of `grain` items that the pool's threads take one at a time as
// they ask (one shared counter), the last chunk first. For work items of uneven cost (attention: sequences of
// different lengths in one batch, later query blocks of a causal prompt seeing more keys), where at::parallel_for's
// equal split can leave one thread nearly all of the work. The items keep their own arithmetic: which thread
// runs one, and when, changes no result.
template <typename F>
inline void parallel_for_dynamic(int64_t n, int64_t grain, const F& f) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  const int64_t chunks = (n + grain - 1) / grain;
  if (chunks <= 1) {
    f(int64_t{0}, n);
    return;
  }
  // torch's pool calls the body once per thread (inline, once, on one thread or inside a parallel region);
  // each call ignores its range and takes chunks from the counter until none is left
  std::atomic<int64_t> next{0};
  torch::stable::parallel_for(0, chunks, 1, [&](int64_t, int64_t) {
    for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < chunks;
         c = next.fetch_add(1, std::memory_order_relaxed)) {
      const int64_t b = (chunks - 1 - c) * grain;
      f(b, std::min(n, b + grain));
    }
  });
}

// Items per parallel chunk so each chunk does at least `target` units of work, where one
// item (row, token) costs `work_per_item` units: small rows are batched, large rows go alone.
inline int64_t grain_for(int64_t work_per_item, int64_t target = 16384) {
  return work_per_item >= target ? 1 : target / (work_per_item > 0 ? work_per_item : 1);
}

}  // namespace keel
