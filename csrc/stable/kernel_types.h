// keel/csrc/stable/kernel_types.h
// Torch-free vocabulary shared by CPU kernels and CUDA launchers: the dtype tag a
// kernel is dispatched on, 16-bit float storage conversions for host code, and the
// row layout that lets kernels take any strides. Safe to include from .cu files.
#pragma once

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define KEEL_HOST_DEVICE __host__ __device__
#define KEEL_KINLINE static inline
#else
#define KEEL_HOST_DEVICE
// Internal to each translation unit: CPU kernels are compiled once per instruction
// set, and a shared inline copy could leak AVX2 code into the baseline path through
// the linker's choice of one definition.
#define KEEL_KINLINE static inline __attribute__((always_inline))
#endif

namespace keel {

// The floating dtypes keel's kernels are instantiated for.
// kFloat64 only where an op says so (fused_muladd, for float64 gradchecks); dispatch_storage
// covers the three half/single types every kernel is built for.
enum class DType : int32_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2, kFloat64 = 3 };

// 16-bit storage types for host kernels (bit patterns, converted through float).
struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

// Maps a row index to an element offset over up to 6 leading (collapsed) dimensions.
struct RowLayout {
  static constexpr int kMaxDims = 6;
  int32_t ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
};

KEEL_HOST_DEVICE KEEL_KINLINE int64_t row_offset(const RowLayout& l, int64_t row) {
  if (l.ndim == 1) return row * l.strides[0];
  int64_t off = 0;
  for (int32_t d = l.ndim - 1; d >= 0; --d) {
    const int64_t i = row % l.sizes[d];
    row /= l.sizes[d];
    off += i * l.strides[d];
  }
  return off;
}

#ifndef __CUDACC__
KEEL_KINLINE float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

KEEL_KINLINE uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

KEEL_KINLINE float load(const float* p) { return *p; }
KEEL_KINLINE float load(const bf16_t* p) { return bits_to_float(static_cast<uint32_t>(p->bits) << 16); }

KEEL_KINLINE void store(float* p, float f) { *p = f; }
KEEL_KINLINE double load(const double* p) { return *p; }
KEEL_KINLINE void store(double* p, double f) { *p = f; }

KEEL_KINLINE void store(bf16_t* p, float f) {
  // round to nearest even; a nan stays a quiet nan (selects, so loops vectorize)
  const uint32_t u = float_to_bits(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  p->bits = static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
}

#if defined(__F16C__)
// The AVX2 build has F16C: one vcvtph2ps / vcvtps2ph per element.
KEEL_KINLINE float load(const f16_t* p) {
  _Float16 h;
  std::memcpy(&h, &p->bits, sizeof(h));
  return static_cast<float>(h);
}

KEEL_KINLINE void store(f16_t* p, float f) {
  const _Float16 h = static_cast<_Float16>(f);
  std::memcpy(&p->bits, &h, sizeof(h));
}
#else
KEEL_KINLINE float load(const f16_t* p) {
  // IEEE binary16 -> binary32 (exact).
  const uint32_t h = p->bits;
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t man = h & 0x3FFu;
  if (exp == 0x1Fu) return bits_to_float(sign | 0x7F800000u | (man << 13));  // inf/nan
  if (exp != 0) return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
  const float mag = static_cast<float>(man) * 5.9604644775390625e-08f;  // subnormal: man * 2^-24
  return sign ? -mag : mag;
}

KEEL_KINLINE void store(f16_t* p, float f) {
  // binary32 -> binary16, round to nearest even, subnormals, overflow to inf.
  const uint32_t u = float_to_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  uint32_t h;
  if (a > 0x7F800000u) {
    h = 0x7E00u;
  } else if (a >= 0x477FF000u) {
    h = 0x7C00u;
  } else if (a < 0x38800000u) {
    // scale to units of 2^-24 and round half-even with the 1.5 * 2^23 trick
    const float mag = bits_to_float(a) * 16777216.0f;
    const float r = (mag + 12582912.0f) - 12582912.0f;
    h = static_cast<uint32_t>(r);
  } else {
    h = (a + 0xFFFu + ((a >> 13) & 1u) - 0x38000000u) >> 13;
  }
  p->bits = static_cast<uint16_t>(sign | h);
}
#endif  // __F16C__

// exp(x) for float32 with about 1 ulp error (Cody-Waite reduction + degree-6 polynomial,
// as in Cephes' expf), written without libm calls or branches so kernel loops vectorize.
// Matches expf at the edges: NaN stays NaN, x > ln(FLT_MAX) gives inf, very negative x gives
// (sub)normal results down to 0. 2^n is applied as two factors so n may reach 128 and -150.
KEEL_KINLINE float exp_f32(float x) {
  // a bit test, not x != x: on a float widened from _Float16 GCC narrows that compare to libgcc's __nehf2
  const bool nan = (float_to_bits(x) & 0x7FFFFFFFu) > 0x7F800000u;
  float xc = x < -104.0f ? -104.0f : x;
  xc = xc > 89.0f ? 89.0f : xc;
  xc = nan ? 0.0f : xc;                                     // keeps the integer conversion below defined for NaN input
  const float t = xc * 1.44269504088896341f + 12582912.0f;  // round(x / ln2) via the 1.5 * 2^23 trick
  const float n = t - 12582912.0f;
  const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t ni = static_cast<int32_t>(n);  // in [-150, 129]
  const int32_t n1 = ni / 2;
  const int32_t n2 = ni - n1;
  const float s1 = bits_to_float(static_cast<uint32_t>(n1 + 127) << 23);
  const float s2 = bits_to_float(static_cast<uint32_t>(n2 + 127) << 23);
  const float e = y * s1 * s2;
  return nan ? x : e;
}

// Calls f(T{}) with T the host storage type of `dt` (float, bf16_t or f16_t).
template <typename F>
KEEL_KINLINE void dispatch_storage(DType dt, F&& f) {
  switch (dt) {
    case DType::kFloat32:
      f(float{});
      break;
    case DType::kBFloat16:
      f(bf16_t{});
      break;
    case DType::kFloat16:
      f(f16_t{});
      break;
    case DType::kFloat64:
      break;  // no kernel but fused_muladd has a float64 path
  }
}

// Rounds a float through the storage type T (the value a store+load would give).
template <typename T>
KEEL_KINLINE float round_to(float f) {
  T t;
  store(&t, f);
  return load(&t);
}
#endif  // !__CUDACC__

}  // namespace keel
