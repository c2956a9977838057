// deep_gemm/csrc/utils/fp8.hpp
// Scalar float8_e4m3fn conversions (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no
// infinity, largest finite 448, NaN = S.1111.111), shared by the casts and the kernels' tails.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace deep_gemm {

constexpr float kFp8E4M3Max = 448.0f;

// Exact value of an e4m3fn byte.
inline float e4m3_to_float(uint8_t v) {
  const float sign = (v & 0x80) ? -1.0f : 1.0f;
  const int e = (v >> 3) & 0xF;
  const int m = v & 0x7;
  if (e == 0xF && m == 0x7) return std::nanf("");
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -9);  // subnormal: m/8 * 2^-6
  return sign * std::ldexp(static_cast<float>(8 + m), e - 10);      // (1 + m/8) * 2^(e-7)
}

// float -> e4m3fn, round to nearest even, saturating: |x| >= 448 (and +-inf) -> +-448, NaN -> NaN.
inline uint8_t float_to_e4m3(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  const float a = std::fabs(x);
  if (std::isnan(a)) return sign | 0x7F;
  if (a >= kFp8E4M3Max) return sign | 0x7E;
  if (a < 0.015625f) {  // below the smallest normal 2^-6: multiples of 2^-9 (8 * 2^-9 is 0x08)
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  uint32_t au;
  std::memcpy(&au, &a, 4);
  au += 0x7FFFFu + ((au >> 20) & 1u);  // round the 23-bit mantissa to 3 bits, ties to even
  const int e = static_cast<int>(au >> 23) - 127 + 7;
  const uint32_t m = (au >> 20) & 0x7u;
  return sign | static_cast<uint8_t>((e << 3) | m);
}

// The smallest power of two >= s (UE8M0 scales), for a positive s; inf stays inf. Exact bit arithmetic,
// not exp2(ceil(log2(s))): log2 in float rounds s = 2^k (1 + 2^-23) down to k, giving a scale below s.
// csrc/cuda/cast.cu computes the same on the device.
inline float ue8m0_ceil(float s) {
  uint32_t u;
  std::memcpy(&u, &s, 4);
  if ((u & 0x7FFFFFu) != 0 && ((u >> 23) & 0xFFu) != 0xFFu) u = (u + 0x800000u) & 0xFF800000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

inline float bf16_to_float(uint16_t v) {
  const uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// float -> bfloat16, round to nearest even, NaN stays NaN.
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace deep_gemm
