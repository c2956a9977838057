// vendored_deps/flash_attn/src/cuda/online_softmax.h
// The online-softmax update of the CUDA kernel (flash_fwd_cuda.cu), as __host__ __device__ functions so a
// host test compiles the very same rule (tests/vendored/flash_attn/test_online_softmax_rule.py).
// Non-finite scores behave as in the CPU twin (src/cpu/vec.h) and torch's SDPA: a NaN score, or a +inf
// one (inf - inf), makes the query's output NaN; a -inf score (a masked key) has weight 0. The max of a
// tile propagates NaN (fmaxf would drop it), and the weight of a score is exp(s - m) unless s is -inf
// (a NaN score keeps its NaN weight instead of the weight 0 that `s > -inf ? ... : 0` gave it).
#pragma once

#include <cmath>

#ifdef __CUDACC__
#define FLASH_SOFTMAX_FN __host__ __device__ __forceinline__
#else
#define FLASH_SOFTMAX_FN inline
#endif

namespace flash {

// max(a, b), NaN when either is NaN (fmaxf returns the other operand)
FLASH_SOFTMAX_FN float nan_max(float a, float b) {
  if (a != a) return a;
  if (b != b) return b;
  return a > b ? a : b;
}

FLASH_SOFTMAX_FN float softmax_exp(float x) {
#ifdef __CUDA_ARCH__
  return __expf(x);
#else
  return std::exp(x);
#endif
}

struct SoftmaxStep {
  float m_new;  // the running max after this tile (NaN once a NaN score was seen)
  float alpha;  // factor of the previous sum and accumulator
  float p;      // the weight of this lane's score
};

// One tile: m the running max before it (-inf: no key yet), tile_max the nan_max of the tile's scores,
// s this lane's score (-inf: masked or out of range).
FLASH_SOFTMAX_FN SoftmaxStep softmax_step(float m, float tile_max, float s) {
  SoftmaxStep r;
  r.m_new = nan_max(m, tile_max);
  // -inf before: nothing accumulated yet (0 also avoids exp(-inf - -inf) = NaN for an all-masked prefix)
  r.alpha = m == -INFINITY ? 0.f : softmax_exp(m - r.m_new);
  r.p = s == -INFINITY ? 0.f : softmax_exp(s - r.m_new);
  return r;
}

// The factor of the accumulator at the end: 1 / l; 0 for a row without a visible key (upstream's 0
// output); NaN stays NaN.
FLASH_SOFTMAX_FN float softmax_final_scale(float l) {
  if (l != l) return l;
  return l > 0.f ? 1.f / l : 0.f;
}

}  // namespace flash
