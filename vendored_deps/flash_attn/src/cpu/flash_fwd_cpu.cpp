// vendored_deps/flash_attn/src/cpu/flash_fwd_cpu.cpp
// CPU forward attention: tiled online softmax (the FlashAttention recurrence) over key tiles of
// 16, fp32 accumulation, for fp32 / bf16 / fp16 inputs. Compiled once per ISA into
// flash::cpu_<isa> (-DVENDORED_CPU_ISA_NS); flash_api.cpp picks one at run time.
//
// Work item: (sequence, block of query rows, kv head, split). The G = h / h_k query heads that share
// a kv head are processed together, so each key / value row is read and converted once for G rows
// (GQA without expanding K/V). With num_splits > 1 each item covers 1/num_splits of the sequence's
// keys and writes an fp32 partial (normalized output + log-sum-exp); combine() merges them.
#include "flash_fwd_cpu.h"

#include "../block_info.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <vector>

#if defined(VENDORED_CPU_ISA_AVX2) || defined(VENDORED_CPU_ISA_AVX512)
#include <immintrin.h>
#endif

namespace flash {
namespace VENDORED_CPU_ISA_NS {
namespace {

constexpr int kTileN = 16;  // keys per tile; page block sizes are multiples of it
constexpr int kPad = 16;    // head dim padded to a multiple of this in the fp32 scratch rows
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct bf16_t { uint16_t x; };
struct fp16_t { uint16_t x; };

// ---- scalar conversions --------------------------------------------------------------------

inline float bits_to_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t f32_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

inline float to_f32(float v) { return v; }
inline float to_f32(bf16_t v) { return bits_to_f32(uint32_t(v.x) << 16); }
inline float to_f32(fp16_t v) {
#if defined(VENDORED_CPU_ISA_AVX2) || defined(VENDORED_CPU_ISA_AVX512)
  return _cvtsh_ss(v.x);
#else
  const uint32_t sign = uint32_t(v.x & 0x8000u) << 16;
  const uint32_t exp = (v.x >> 10) & 0x1fu, man = v.x & 0x3ffu;
  if (exp == 0) {
    const float mag = float(man) * 5.9604644775390625e-8f;  // subnormal: man * 2^-24
    return bits_to_f32(f32_to_bits(mag) | sign);
  }
  if (exp == 31) return bits_to_f32(sign | 0x7f800000u | (man << 13));
  return bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
#endif
}

template <typename T> T from_f32(float f);
template <> inline float from_f32<float>(float f) { return f; }
template <> inline bf16_t from_f32<bf16_t>(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{uint16_t((u >> 16) | 0x40u)};  // nan stays nan
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return bf16_t{uint16_t(u >> 16)};
}
template <> inline fp16_t from_f32<fp16_t>(float f) {
#if defined(VENDORED_CPU_ISA_AVX2) || defined(VENDORED_CPU_ISA_AVX512)
  return fp16_t{uint16_t(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT))};
#else
  uint32_t x = f32_to_bits(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return fp16_t{uint16_t(sign | 0x7e00u)};
  if (x >= 0x477ff000u) return fp16_t{uint16_t(sign | 0x7c00u)};  // rounds to inf
  if (x < 0x38800000u) {                                          // fp16 subnormal or zero
    return fp16_t{uint16_t(sign | uint16_t(std::nearbyint(bits_to_f32(x) * 16777216.0f)))};
  }
  uint32_t h = (((x >> 23) - 112u) << 10) | ((x >> 13) & 0x3ffu);
  const uint32_t rest = x & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return fp16_t{uint16_t(sign | h)};
#endif
}

// ---- row primitives (dst/src rows padded to a multiple of kPad with zeros) --------------------

template <typename T>
inline void load_row(const T* __restrict__ src, float* __restrict__ dst, int d, int dp) {
  int i = 0;
#if defined(VENDORED_CPU_ISA_AVX512)
  if constexpr (std::is_same_v<T, bf16_t>) {
    for (; i + 16 <= d; i += 16) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
      _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)));
    }
  } else if constexpr (std::is_same_v<T, fp16_t>) {
    for (; i + 16 <= d; i += 16)
      _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  }
#elif defined(VENDORED_CPU_ISA_AVX2)
  if constexpr (std::is_same_v<T, bf16_t>) {
    for (; i + 8 <= d; i += 8) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16)));
    }
  } else if constexpr (std::is_same_v<T, fp16_t>) {
    for (; i + 8 <= d; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
#endif
  for (; i < d; ++i) dst[i] = to_f32(src[i]);
  for (; i < dp; ++i) dst[i] = 0.f;
}

#if !defined(VENDORED_CPU_ISA_AVX512)
inline float dot(const float* __restrict__ a, const float* __restrict__ b, int dp) {
  float acc[kPad] = {};
  for (int i = 0; i < dp; i += kPad)
    for (int u = 0; u < kPad; ++u) acc[u] += a[i + u] * b[i + u];
  float s = 0.f;
  for (int u = 0; u < kPad; ++u) s += acc[u];
  return s;
}
#endif


#if defined(VENDORED_CPU_ISA_AVX512)
// out lane j = sum of the 16 lanes of v[j]: a transposing reduction tree (15 adds for 16 rows
// instead of 16 separate horizontal sums).
inline __m512 hsum16(__m512 v[16]) {
  __m512 t[8], u[4];
  for (int i = 0; i < 8; ++i)
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
    u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  const __m512 x01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
  const __m512 x23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, 0x88), _mm512_shuffle_f32x4(x01, x23, 0xDD));
}

// s[jj] = q . k[jj] for the 16 rows of a key tile, bf16 inputs, vdpbf16ps (rows past the tile point
// at zeros). d is a multiple of 8.
inline void scores16_bf16(const bf16_t* q, const bf16_t* const* k, int d, float* s) {
  __m512 acc[16];
  for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
  for (int c = 0; c < d; c += 32) {
    const __mmask32 m = d - c >= 32 ? ~__mmask32(0) : static_cast<__mmask32>((1ull << (d - c)) - 1);
    const __m512bh qc = reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(m, q + c));
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j)
      acc[j] = _mm512_dpbf16_ps(acc[j], qc, reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(m, k[j] + c)));
  }
  _mm512_storeu_ps(s, hsum16(acc));
}

// The same over fp32 rows padded to dp (a multiple of 16).
inline void scores16_f32(const float* q, const float* k, int dp, float* s) {
  __m512 acc[16];
  for (int j = 0; j < 16; ++j) acc[j] = _mm512_setzero_ps();
  for (int c = 0; c < dp; c += 16) {
    const __m512 qc = _mm512_loadu_ps(q + c);
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) acc[j] = _mm512_fmadd_ps(qc, _mm512_loadu_ps(k + size_t(j) * dp + c), acc[j]);
  }
  _mm512_storeu_ps(s, hsum16(acc));
}

// o += sum_j p[j] * v[j] over nk fp32 rows padded to dp, o kept in registers 64 floats at a time.
inline void pv_tile(const float* p, const float* v, int nk, int dp, float* o) {
  for (int c = 0; c < dp; c += 64) {
    const int n = std::min(4, (dp - c) / 16);
    __m512 a0 = _mm512_loadu_ps(o + c);
    __m512 a1 = n > 1 ? _mm512_loadu_ps(o + c + 16) : _mm512_setzero_ps();
    __m512 a2 = n > 2 ? _mm512_loadu_ps(o + c + 32) : _mm512_setzero_ps();
    __m512 a3 = n > 3 ? _mm512_loadu_ps(o + c + 48) : _mm512_setzero_ps();
    for (int j = 0; j < nk; ++j) {
      const __m512 pj = _mm512_set1_ps(p[j]);
      const float* vj = v + size_t(j) * dp + c;
      a0 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj), a0);
      if (n > 1) a1 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj + 16), a1);
      if (n > 2) a2 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj + 32), a2);
      if (n > 3) a3 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj + 48), a3);
    }
    _mm512_storeu_ps(o + c, a0);
    if (n > 1) _mm512_storeu_ps(o + c + 16, a1);
    if (n > 2) _mm512_storeu_ps(o + c + 32, a2);
    if (n > 3) _mm512_storeu_ps(o + c + 48, a3);
  }
}
#else
// o += sum_j p[j] * v[j] over nk fp32 rows padded to dp, 16 floats of o at a time.
inline void pv_tile(const float* p, const float* v, int nk, int dp, float* o) {
  for (int c = 0; c < dp; c += kPad) {
    float acc[kPad];
    for (int u = 0; u < kPad; ++u) acc[u] = o[c + u];
    for (int j = 0; j < nk; ++j) {
      const float pj = p[j];
      const float* vj = v + size_t(j) * dp + c;
      for (int u = 0; u < kPad; ++u) acc[u] += pj * vj[u];
    }
    for (int u = 0; u < kPad; ++u) o[c + u] = acc[u];
  }
}
#endif

inline void axpy(float a, const float* __restrict__ x, float* __restrict__ y, int dp) {
  for (int i = 0; i < dp; ++i) y[i] += a * x[i];
}

inline void scale_row(float a, float* __restrict__ y, int dp) {
  for (int i = 0; i < dp; ++i) y[i] *= a;
}

// exp over one tile of scores, polynomial (Cephes expf coefficients), written so the compiler
// vectorizes it for every ISA; exp(-inf) is exactly 0 (masked keys).
inline void exp_tile(const float* x, float m, float* y) {
  for (int u = 0; u < kTileN; ++u) {
    const float v = std::min(std::max(x[u] - m, -87.33654f), 88.72283f);
    const float t = v * 1.44269504088896341f + 12582912.0f;  // round to nearest via 1.5 * 2^23
    const float n = t - 12582912.0f;
    const float r = (v - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t e = static_cast<int32_t>(n) + 127;
    const float scale = bits_to_f32(static_cast<uint32_t>(e > 0 ? e : 0) << 23);
    y[u] = x[u] == kNegInf ? 0.f : p * scale;
  }
}

struct Job {
  const Flash_fwd_params* p;
  int block_m;     // query positions per item
  int n_mblocks;   // item blocks along the queries
  int dp;          // padded head dim
};

struct Scratch {
  std::vector<float> q, o, m, l, s, kf, vf;
  std::vector<bf16_t> zeros;  // a zero key row for the tail of a partial tile
  const bf16_t* zero_row = nullptr;
  explicit Scratch(const Job& job) {
    const int rows = job.block_m * job.p->h_h_k_ratio;
    q.resize(size_t(rows) * job.dp);
    o.resize(size_t(rows) * job.dp);
    m.resize(rows);
    l.resize(rows);
    s.resize(size_t(rows) * kTileN);
    kf.resize(size_t(kTileN) * job.dp);
    vf.resize(size_t(kTileN) * job.dp);
    zeros.assign(size_t(job.dp), bf16_t{0});
    zero_row = zeros.data();
  }
};

template <typename T>
void attend(const Job& job, Scratch& sc, int b, int mb, int hk, int split) {
  const Flash_fwd_params& p = *job.p;
  const BlockInfo seq = block_info(p, b);
  const int m0 = mb * job.block_m;
  if (m0 >= seq.sq) return;
  const int mq = std::min(job.block_m, seq.sq - m0);
  const int G = p.h_h_k_ratio, R = mq * G, d = p.d, dp = job.dp;
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
    const int i = m0 + r / G, h = hk * G + r % G;
    qrow[r] = q + seq.q_off + int64_t(i) * p.q_row_stride + int64_t(h) * p.q_head_stride;
    load_row(qrow[r], Q + size_t(r) * dp, d, dp);
    std::fill(O + size_t(r) * dp, O + size_t(r + 1) * dp, 0.f);
    sc.m[r] = kNegInf;
    sc.l[r] = 0.f;
  }

  for (int t0 = lo; t0 < hi;) {
    const int t1 = std::min(hi, (t0 / kTileN + 1) * kTileN);  // never crosses a page block
    const int nk = t1 - t0;
    const int64_t krow = kv_row(p, b, t0, false) + int64_t(hk) * p.k_head_stride;
    const int64_t vrow = kv_row(p, b, t0, true) + int64_t(hk) * p.v_head_stride;
    // scores S[r][jj] = q_r . k_j
#if defined(VENDORED_CPU_ISA_AVX512)
    if constexpr (std::is_same_v<T, bf16_t>) {
      const T* krows[kTileN];
      for (int jj = 0; jj < kTileN; ++jj) krows[jj] = jj < nk ? k + krow + int64_t(jj) * p.k_row_stride : sc.zero_row;
      for (int r = 0; r < R; ++r) scores16_bf16(qrow[r], krows, d, S + r * kTileN);
    } else {
      for (int jj = 0; jj < kTileN; ++jj) {
        float* dst = sc.kf.data() + size_t(jj) * dp;
        if (jj < nk) load_row(k + krow + int64_t(jj) * p.k_row_stride, dst, d, dp);
        else std::fill(dst, dst + dp, 0.f);
      }
      for (int r = 0; r < R; ++r) scores16_f32(Q + size_t(r) * dp, sc.kf.data(), dp, S + r * kTileN);
    }
#else
    for (int jj = 0; jj < nk; ++jj) load_row(k + krow + int64_t(jj) * p.k_row_stride, sc.kf.data() + size_t(jj) * dp, d, dp);
    for (int r = 0; r < R; ++r)
      for (int jj = 0; jj < nk; ++jj) S[r * kTileN + jj] = dot(Q + size_t(r) * dp, sc.kf.data() + size_t(jj) * dp, dp);
#endif
    // online softmax update per row
    for (int r = 0; r < R; ++r) {
      float* s = S + r * kTileN;
      const int i = m0 + r / G;
      const KeyRange vis = visible_keys(p, seq, i);
      const int rlo = vis.lo, rhi = vis.hi;
      float mt = kNegInf;
      for (int jj = 0; jj < kTileN; ++jj) {
        const int j = t0 + jj;
        float x = kNegInf;
        if (jj < nk && j >= rlo && j < rhi) {
          x = p.softcap > 0.f ? p.scale_softmax * std::tanh(s[jj] * p.softcap) : s[jj] * p.scale_softmax;
        }
        s[jj] = x;
        mt = std::max(mt, x);
      }
      const float m_new = std::max(sc.m[r], mt);
      if (m_new == kNegInf) {  // nothing visible yet: P row is 0
        std::fill(s, s + kTileN, 0.f);
        continue;
      }
      exp_tile(s, m_new, s);
      float sum = 0.f;
      for (int jj = 0; jj < kTileN; ++jj) sum += s[jj];
      if (sc.m[r] != m_new) {
        const float alpha = sc.m[r] == kNegInf ? 0.f : std::exp(sc.m[r] - m_new);
        sc.l[r] *= alpha;
        scale_row(alpha, O + size_t(r) * dp, dp);
      }
      sc.l[r] += sum;
      sc.m[r] = m_new;
    }
    // O += P V (V rows converted once per tile, reused by the R rows)
    for (int jj = 0; jj < nk; ++jj) load_row(v + vrow + int64_t(jj) * p.v_row_stride, sc.vf.data() + size_t(jj) * dp, d, dp);
    for (int r = 0; r < R; ++r) {
      if (sc.m[r] != kNegInf) pv_tile(S + r * kTileN, sc.vf.data(), nk, dp, O + size_t(r) * dp);
    }
    t0 = t1;
  }

  // finalize: rows with no visible key give 0 (as upstream)
  for (int r = 0; r < R; ++r) {
    const int i = m0 + r / G, h = hk * G + r % G;
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
  Scratch sc(job);
  for (int64_t it = begin; it < end; ++it) {
    int64_t rest = it;
    const int split = int(rest % p.num_splits);
    rest /= p.num_splits;
    const int hk = int(rest % p.h_k);
    rest /= p.h_k;
    const int mb = int(rest % job.n_mblocks);
    const int b = int(rest / job.n_mblocks);
    attend<T>(job, sc, b, mb, hk, split);
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
  for (int64_t idx = begin; idx < end; ++idx) {
    const int64_t row = idx / p.h;
    const int h = int(idx % p.h);
    float mx = kNegInf;
    for (int s = 0; s < p.num_splits; ++s) mx = std::max(mx, lse[s * plane + idx]);
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
}

template <typename T>
void run_typed(const Flash_fwd_params& p, const CpuRun& run) {
  Job job{&p, 1, 1, (p.d + kPad - 1) / kPad * kPad};
  // about 64 rows (query positions x heads of a group) per item: K/V rows are reused that often
  job.block_m = std::max(1, std::min(p.seqlen_q, 64 / std::max(1, p.h_h_k_ratio)));
  job.block_m = std::min(job.block_m, std::max(1, 256 / p.h_h_k_ratio));
  job.n_mblocks = (p.seqlen_q + job.block_m - 1) / job.block_m;
  const int64_t items = int64_t(p.b) * job.n_mblocks * p.h_k * p.num_splits;
  if (run.parallel_for) run.parallel_for(items, 1, &job, &attend_items<T>);
  else attend_items<T>(&job, 0, items);
  if (p.num_splits > 1) {
    const int64_t rows = int64_t(p.total_q) * p.h;
    const int64_t grain = std::max<int64_t>(1, 4096 / std::max(1, p.d * p.num_splits));
    if (run.parallel_for) run.parallel_for(rows, grain, &job, &combine<T>);
    else combine<T>(&job, 0, rows);
  }
}

}  // namespace

void run_mha_fwd(const Flash_fwd_params& params, const CpuRun& run) {
  switch (params.dtype) {
    case DType::kFloat32: run_typed<float>(params, run); break;
    case DType::kBFloat16: run_typed<bf16_t>(params, run); break;
    case DType::kFloat16: run_typed<fp16_t>(params, run); break;
    default: throw std::invalid_argument("flash_attn: unsupported dtype");
  }
}

}  // namespace VENDORED_CPU_ISA_NS
}  // namespace flash
