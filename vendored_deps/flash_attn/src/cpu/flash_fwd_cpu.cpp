// vendored_deps/flash_attn/src/cpu/flash_fwd_cpu.cpp
// CPU forward attention: tiled online softmax (the FlashAttention recurrence) over key tiles of
// 16, fp32 accumulation, for fp32 / bf16 / fp16 inputs. Compiled once per ISA into
// flash::cpu_<isa> (-DVENDORED_CPU_ISA_NS); flash_api.cpp picks one at run time.
//
// Work item: (sequence, block of query rows, kv head, split). The G = h / h_k query heads that share
// a kv head are processed together, so each key / value row is read and converted once for G rows
// (GQA without expanding K/V). With num_splits > 1 (only when the caller asks: the CPU never chooses a split)
// each item covers 1/num_splits of the sequence's keys and writes an fp32 partial (normalized output +
// log-sum-exp); combine() merges them and counts what it merged (run_mha_fwd returns the count:
// flash::last_splitkv_stats).
//
// Summation order: a query row's output depends only on its own query, keys and values, never on
// the call: key tiles end at multiples of 16 keys (and at page ends: page sizes that are multiples of 16 give
// the same tiles paged or contiguous), keys a row does not see add exact zeros, and no per-row step depends on
// which other rows, heads or sequences share the item or the call. So a query gives the same bits in a
// prefill, with its prefix from the paged cache, batched or alone, and as a decode query, on any thread count.
// Not with num_splits > 1: the split changes the order.
#include "flash_fwd_cpu.h"

#include "../block_info.h"
#include "vec.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <vector>

namespace flash {
namespace VENDORED_CPU_ISA_NS {
namespace {

struct Job {
  const Flash_fwd_params* p;
  int block_m;    // query positions per item
  int n_mblocks;  // item blocks along the queries
  int dp;         // padded head dim
  int kv_group;   // kv heads per item (all of them for decode: each page is then read once)
  // the partials combine() has merged (split-K only)
  std::atomic<int64_t>* combined = nullptr;
};

// Per-thread buffers, kept between calls (a decode call is a few microseconds: allocating and zeroing
// them each time was a measurable share). Every element a call reads it writes first, except
// `zeros`, which is only ever zero.
struct Scratch {
  std::vector<float> q, o, m, l, s, kf, vf;
  std::vector<bf16_t> zeros;  // a zero key row for the tail of a partial tile
  const bf16_t* zero_row = nullptr;
  void prepare(const Job& job) {
    const int rows = job.block_m * job.p->h_h_k_ratio * job.kv_group;
    grow(q, size_t(rows) * job.dp);
    grow(o, size_t(rows) * job.dp);
    grow(m, rows);
    grow(l, rows);
    grow(s, size_t(rows) * kTileN);
    grow(kf, size_t(kTileN) * job.dp);
    grow(vf, size_t(kTileN) * job.dp);
    grow(zeros, size_t(job.dp));
    zero_row = zeros.data();
  }
  template <typename V>
  static void grow(std::vector<V>& v, size_t n) {
    if (v.size() < n) v.resize(n);  // value-initialized: zeros
  }
};

// Prefetches the K and V rows of keys [t0, t1) (within one page) of kv head hk: pages follow the
// block table, so the hardware prefetcher cannot guess the next one.
template <typename T>
inline void prefetch_tile(const Flash_fwd_params& p, int b, int hk, int t0, int t1, const T* k, const T* v) {
  if (p.block_table) t1 = std::min(t1, (t0 / p.page_block_size + 1) * p.page_block_size);
  const char* kr = reinterpret_cast<const char*>(k + kv_row(p, b, t0, false) + int64_t(hk) * p.k_head_stride);
  const char* vr = reinterpret_cast<const char*>(v + kv_row(p, b, t0, true) + int64_t(hk) * p.v_head_stride);
  const int64_t row_bytes = int64_t(p.d) * int64_t(sizeof(T));
  for (int j = 0; j < t1 - t0; ++j) {
    for (int64_t c = 0; c < row_bytes; c += 64) {
      __builtin_prefetch(kr + j * p.k_row_stride * int64_t(sizeof(T)) + c);
      __builtin_prefetch(vr + j * p.v_row_stride * int64_t(sizeof(T)) + c);
    }
  }
}

// Rows of an item: for each of its kv heads, its G query heads x mq query positions.
struct RowMap {
  int m0, G, per_head, hk0;
  int pos(int r) const { return m0 + (r % per_head) / G; }
  int head(int r) const { return (hk0 + r / per_head) * G + (r % per_head) % G; }
};

template <typename T>
void attend(const Job& job, Scratch& sc, int b, int mb, int hk0, int split) {
  const Flash_fwd_params& p = *job.p;
  const BlockInfo seq = block_info(p, b);
  const int m0 = mb * job.block_m;
  if (m0 >= seq.sq) return;
  const int mq = std::min(job.block_m, seq.sq - m0);
  const int G = p.h_h_k_ratio, PH = mq * G, nkv = job.kv_group, R = PH * nkv, d = p.d, dp = job.dp;
  const RowMap map{m0, G, PH, hk0};
  // the block's rows see keys from the first row's lower bound to the last row's upper bound
  int lo = visible_keys(p, seq, m0).lo, hi = visible_keys(p, seq, m0 + mq - 1).hi;
  if (p.num_splits > 1) {
    const int per = ((seq.sk + p.num_splits - 1) / p.num_splits + kTileN - 1) / kTileN * kTileN;
    lo = std::max(lo, split * per);
    hi = std::min(hi, (split + 1) * per);
  }

  const T* q = static_cast<const T*>(p.q_ptr);
  const T* k = static_cast<const T*>(p.k_ptr);
  const T* v = static_cast<const T*>(p.v_ptr);
  float* O = sc.o.data();
  float* Q = sc.q.data();
  float* S = sc.s.data();
  const T* qrow[256];  // raw q rows (the bf16 dot reads them directly); R <= 256 by construction
  for (int r = 0; r < R; ++r) {
    qrow[r] = q + seq.q_off + int64_t(map.pos(r)) * p.q_row_stride + int64_t(map.head(r)) * p.q_head_stride;
    load_row(qrow[r], Q + size_t(r) * dp, d, dp);
    std::fill(O + size_t(r) * dp, O + size_t(r + 1) * dp, 0.f);
    sc.m[r] = kNegInf;
    sc.l[r] = 0.f;
  }

  for (int t0 = lo; t0 < hi;) {
    int t1 = std::min(hi, (t0 / kTileN + 1) * kTileN);
    if (p.block_table) t1 = std::min(t1, (t0 / p.page_block_size + 1) * p.page_block_size);  // one page per tile
    const int nk = t1 - t0;
    const int64_t krow0 = kv_row(p, b, t0, false), vrow0 = kv_row(p, b, t0, true);
    // scores S[r][jj] = q_r . k_j, kv head by kv head (the item's heads share each page)
    for (int kvl = 0; kvl < nkv; ++kvl) {
      const int hk = hk0 + kvl, r0 = kvl * PH, r1 = r0 + PH;
      const int64_t krow = krow0 + int64_t(hk) * p.k_head_stride;
      if (t1 < hi) prefetch_tile(p, b, hk, t1, std::min(hi, t1 + kTileN), k, v);  // the next page is anywhere
#if defined(VENDORED_CPU_ISA_AVX512)
      if constexpr (std::is_same_v<T, bf16_t>) {
        const T* krows[kTileN];
        for (int jj = 0; jj < kTileN; ++jj) krows[jj] = jj < nk ? k + krow + int64_t(jj) * p.k_row_stride : sc.zero_row;
        for (int r = r0; r < r1; ++r) scores16_bf16(qrow[r], krows, d, S + r * kTileN);
      } else {
        for (int jj = 0; jj < kTileN; ++jj) {
          float* dst = sc.kf.data() + size_t(jj) * dp;
          if (jj < nk)
            load_row(k + krow + int64_t(jj) * p.k_row_stride, dst, d, dp);
          else
            std::fill(dst, dst + dp, 0.f);
        }
        for (int r = r0; r < r1; ++r) scores16_f32(Q + size_t(r) * dp, sc.kf.data(), dp, S + r * kTileN);
      }
#else
      for (int jj = 0; jj < nk; ++jj)
        load_row(k + krow + int64_t(jj) * p.k_row_stride, sc.kf.data() + size_t(jj) * dp, d, dp);
      for (int r = r0; r < r1; ++r)
        for (int jj = 0; jj < nk; ++jj)
          S[r * kTileN + jj] = dot(Q + size_t(r) * dp, sc.kf.data() + size_t(jj) * dp, dp);
#endif
    }
    // online softmax update: each row's masked, scaled scores and their maximum, exp, then the row sums
    // (each row adds its 16 terms in order; the rows' addition chains run interleaved), then the rescale
    float m_new[256], sum[256];  // R <= 256
    for (int r = 0; r < R; ++r) {
      float* s = S + r * kTileN;
      const KeyRange vis = visible_keys(p, seq, map.pos(r));
      float mt = kNegInf;
#if defined(VENDORED_CPU_ISA_AVX512)
      if (!(p.softcap > 0.f)) {  // visible keys jj in [a, b): x = s * scale, the rest -inf
        const int a = std::min(std::max(vis.lo - t0, 0), kTileN), b = std::min(std::min(vis.hi - t0, nk), kTileN);
        const __mmask16 vm = b > a ? __mmask16(((1u << b) - 1u) & ~((1u << a) - 1u)) : __mmask16(0);
        const __m512 neg_inf = _mm512_set1_ps(kNegInf);
        const __m512 x = _mm512_mask_mul_ps(neg_inf, vm, _mm512_loadu_ps(s), _mm512_set1_ps(p.scale_softmax));
        _mm512_storeu_ps(s, x);
        // the maximum as the scalar loop's std::max(mt, x) takes it: a NaN score never wins
        mt = _mm512_reduce_max_ps(_mm512_mask_mov_ps(neg_inf, _mm512_cmp_ps_mask(x, x, _CMP_ORD_Q), x));
      } else
#endif
      {
        for (int jj = 0; jj < kTileN; ++jj) {
          const int j = t0 + jj;
          float x = kNegInf;
          if (jj < nk && j >= vis.lo && j < vis.hi) {
            x = p.softcap > 0.f ? p.scale_softmax * std::tanh(s[jj] * p.softcap) : s[jj] * p.scale_softmax;
          }
          s[jj] = x;
          mt = std::max(mt, x);
        }
      }
      m_new[r] = std::max(sc.m[r], mt);
      if (m_new[r] == kNegInf) {  // nothing visible yet: P row is 0
        std::fill(s, s + kTileN, 0.f);
        continue;
      }
      exp_tile(s, m_new[r], s);
    }
    for (int r = 0; r < R; ++r) sum[r] = 0.f;
    for (int jj = 0; jj < kTileN; ++jj)
      for (int r = 0; r < R; ++r) sum[r] += S[r * kTileN + jj];
    for (int r = 0; r < R; ++r) {
      if (m_new[r] == kNegInf) continue;
      if (sc.m[r] != m_new[r]) {
        const float alpha = sc.m[r] == kNegInf ? 0.f : std::exp(sc.m[r] - m_new[r]);
        sc.l[r] *= alpha;
        scale_row(alpha, O + size_t(r) * dp, dp);
      }
      sc.l[r] += sum[r];
      sc.m[r] = m_new[r];
    }
    // O += P V (V rows converted once per tile and kv head, reused by that head's rows)
    for (int kvl = 0; kvl < nkv; ++kvl) {
      const int hk = hk0 + kvl, r0 = kvl * PH, r1 = r0 + PH;
      const int64_t vrow = vrow0 + int64_t(hk) * p.v_head_stride;
#if defined(VENDORED_CPU_ISA_AVX512)
      if constexpr (std::is_same_v<T, bf16_t>) {  // value rows read in place, several query rows per pass
        const bf16_t* vrows[kTileN];
        for (int jj = 0; jj < nk; ++jj) vrows[jj] = v + vrow + int64_t(jj) * p.v_row_stride;
        const float* prow[256];
        float* orow[256];
        int n = 0;
        for (int r = r0; r < r1; ++r) {
          if (sc.m[r] == kNegInf) continue;  // nothing visible yet: the row is left as it is
          prow[n] = S + r * kTileN;
          orow[n++] = O + size_t(r) * dp;
        }
        pv_bf16(prow, vrows, nk, d, orow, n);
        continue;
      }
#endif
      for (int jj = 0; jj < nk; ++jj)
        load_row(v + vrow + int64_t(jj) * p.v_row_stride, sc.vf.data() + size_t(jj) * dp, d, dp);
      for (int r = r0; r < r1; ++r) {
        if (sc.m[r] != kNegInf) pv_tile(S + r * kTileN, sc.vf.data(), nk, dp, O + size_t(r) * dp);
      }
    }
    t0 = t1;
  }

  // finalize: rows with no visible key give 0 (as upstream)
  for (int r = 0; r < R; ++r) {
    const int i = map.pos(r), h = map.head(r);
    const float l = sc.l[r];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const float* orow = O + size_t(r) * dp;
    if (p.num_splits > 1) {
      const int64_t row = (int64_t(split) * p.total_q + seq.q_row0 + i) * p.h + h;
      float* acc = static_cast<float*>(p.oaccum_ptr) + row * d;
      for (int c = 0; c < d; ++c) acc[c] = orow[c] * inv;
      static_cast<float*>(p.softmax_lseaccum_ptr)[row] = l > 0.f ? sc.m[r] + std::log(l) : kNegInf;
    } else {
      T* out = static_cast<T*>(p.o_ptr) + seq.o_off + int64_t(i) * p.o_row_stride + int64_t(h) * p.o_head_stride;
      for (int c = 0; c < d; ++c) out[c] = from_f32<T>(orow[c] * inv);
    }
  }
}

template <typename T>
void attend_items(void* ctx, int64_t begin, int64_t end) {
  const Job& job = *static_cast<const Job*>(ctx);
  const Flash_fwd_params& p = *job.p;
  thread_local Scratch sc;
  sc.prepare(job);
  for (int64_t it = begin; it < end; ++it) {
    int64_t rest = it;
    const int split = int(rest % p.num_splits);
    rest /= p.num_splits;
    const int groups = p.h_k / job.kv_group;
    const int hk0 = int(rest % groups) * job.kv_group;
    rest /= groups;
    const int mb = int(rest % job.n_mblocks);
    const int b = int(rest / job.n_mblocks);
    attend<T>(job, sc, b, mb, hk0, split);
  }
}

// Merges the num_splits partials of each (row, head) by their log-sum-exp.
template <typename T>
void combine(void* ctx, int64_t begin, int64_t end) {
  const Job& job = *static_cast<const Job*>(ctx);
  const Flash_fwd_params& p = *job.p;
  const float* lse = static_cast<const float*>(p.softmax_lseaccum_ptr);
  const float* acc = static_cast<const float*>(p.oaccum_ptr);
  const int64_t plane = int64_t(p.total_q) * p.h;
  std::vector<float> o(p.d);
  int64_t merged = 0;
  for (int64_t idx = begin; idx < end; ++idx) {
    const int64_t row = idx / p.h;
    const int h = int(idx % p.h);
    float mx = kNegInf;
    for (int s = 0; s < p.num_splits; ++s, ++merged) mx = std::max(mx, lse[s * plane + idx]);
    std::fill(o.begin(), o.end(), 0.f);
    if (mx != kNegInf) {
      float wsum = 0.f;
      for (int s = 0; s < p.num_splits; ++s) {
        const float w = lse[s * plane + idx] == kNegInf ? 0.f : std::exp(lse[s * plane + idx] - mx);
        wsum += w;
        if (w != 0.f) axpy(w, acc + (s * plane + idx) * p.d, o.data(), p.d);
      }
      scale_row(1.f / wsum, o.data(), p.d);
    }
    // row -> (sequence, position): batch mode rows are b * seqlen_q + i; varlen rows are global
    int64_t off;
    if (p.cu_seqlens_q) {
      off = row * p.o_row_stride;
    } else {
      off = (row / p.seqlen_q) * p.o_batch_stride + (row % p.seqlen_q) * p.o_row_stride;
    }
    T* out = static_cast<T*>(p.o_ptr) + off + int64_t(h) * p.o_head_stride;
    for (int c = 0; c < p.d; ++c) out[c] = from_f32<T>(o[c]);
  }
  job.combined->fetch_add(merged, std::memory_order_relaxed);
}

template <typename T>
int64_t run_typed(const Flash_fwd_params& p, const CpuRun& run) {
  std::atomic<int64_t> combined{0};
  Job job{&p, cpu_block_m(p), 1, (p.d + kPad - 1) / kPad * kPad, cpu_kv_heads_per_item(p, run.num_threads), &combined};
  job.n_mblocks = (p.seqlen_q + job.block_m - 1) / job.block_m;
  const int64_t items = int64_t(p.b) * job.n_mblocks * (p.h_k / job.kv_group) * p.num_splits;
  if (run.parallel_for)
    run.parallel_for(items, 1, &job, &attend_items<T>);
  else
    attend_items<T>(&job, 0, items);
  if (p.num_splits > 1) {
    const int64_t rows = int64_t(p.total_q) * p.h;
    const int64_t grain = std::max<int64_t>(1, 4096 / std::max(1, p.d * p.num_splits));
    if (run.parallel_for)
      run.parallel_for(rows, grain, &job, &combine<T>);
    else
      combine<T>(&job, 0, rows);
  }
  return combined.load();
}

}  // namespace

int64_t run_mha_fwd(const Flash_fwd_params& params, const CpuRun& run) {
  switch (params.dtype) {
    case DType::kFloat32:
      return run_typed<float>(params, run);
    case DType::kBFloat16:
      return run_typed<bf16_t>(params, run);
    case DType::kFloat16:
      return run_typed<fp16_t>(params, run);
    default:
      throw std::invalid_argument("flash_attn: unsupported dtype");
  }
}

}  // namespace VENDORED_CPU_ISA_NS
}  // namespace flash
