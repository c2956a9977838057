// keel/csrc/ops/fp8_linear.h
// y[m, n] = sum_k x[m, k] * dequant(w[n, k]) + bias[n] for an e4m3 weight with fp32 scales per 128-wide K
// block (one per row, or per 128 rows), fp32 accumulation; x is not quantized (weight-only FP8).
#pragma once

#include <cstdint>

#include "ops/cpu_isa.h"
#include "stable/kernel_types.h"

namespace keel {

constexpr int64_t kFp8BlockK = 128;   // K block of one weight scale
constexpr int64_t kFp8RowBlock = 32;  // rows of x per pass over the weight
constexpr float kFp8Unit = 256.0f;    // the kernels' fp16 decode of e4m3 yields the value times 2^-8

struct Fp8LinearParams {
  DType dtype;     // of out and bias
  void* out;       // contiguous [m, n]
  const float* x;  // fp32 [m, kp], zero past k (kp: k rounded up to kFp8BlockK)
  int64_t kp;
  // Only when cpu_has_avx512bf16() and x is bf16 (finite, not extreme): x16[i] = x[i] * 2^e_i in bf16
  // (exact), [m, kp] zero past k, with e_i chosen per row so that max |x16[i]| is in [2^64, 2^65); the
  // kernel's sums are then in units of 2^(e_i - 120): x16_unscale[i] = 2^(120 - e_i) brings them back and
  // x_scale[i] = 2^(e_i - 112) takes an exact fp32 block's sum (value * 2^-8) there. nullptr otherwise.
  // Per row: x16_ok[i] = 0 marks a row that takes the exact fp32 path throughout (a non-finite x, or one too
  // large or too small to scale), with x16_unscale[i] = 1 and x_scale[i] = kFp8Unit (its sums in units of 1);
  // its x16 row is zeros and unread.
  const uint16_t* x16;
  const float* x16_unscale;
  const float* x_scale;
  const uint8_t* x16_ok;
  const uint8_t* w;  // e4m3 bytes [n, k]: row r at w + r * w_row
  int64_t w_row;
  const float* scale;  // block (r, b) scales by scale[(r / scale_rows) * scale_s0 + b * scale_s1]
  int64_t scale_rows;
  int64_t scale_s0;
  int64_t scale_s1;
  // bool [n] every row_special_stride bytes, or nullptr: 1 where weight row r holds a subnormal or NaN byte (the
  // caller's fp8_special_rows of w); the one-row AVX512-BF16 GEMV then trusts it instead of scanning each row
  const uint8_t* row_special;
  int64_t row_special_stride;
  const void* bias;  // [n] every bias_stride elements, or nullptr
  int64_t bias_stride;
  int64_t m;
  int64_t n;
  int64_t k;
};

// Output features [begin, end) for all m rows (m <= kFp8RowBlock); each weight row is read once.
KEEL_DECLARE_CPU_KERNEL(fp8_linear_cols, Fp8LinearParams)

// An e4m3 weight as the CPU kernels read it: keel::fp8_linear's qweight, scale, bias and special_rows.
struct Fp8Weight {
  const uint8_t* w;  // [n, k]: row r at w + r * w_row
  int64_t w_row;
  const float* scale;  // block (r, b) scales by scale[(r / scale_rows) * scale_s0 + b * scale_s1]
  int64_t scale_rows;
  int64_t scale_s0;
  int64_t scale_s1;
  const uint8_t* row_special = nullptr;  // bool [n] every row_special_stride bytes, or nullptr
  int64_t row_special_stride = 0;
  const void* bias;  // [n] in the activations' dtype every bias_stride elements, or nullptr
  int64_t bias_stride;
  int64_t n;
};

// keel::fp8_linear on the CPU after its checks: out [m, n] = x [m, k] @ dequant(w)^T + bias, x contiguous rows and
// out in dtype dt. The fused layer ops run their FP8 projections through it too (the op's bits).
void fp8_linear_cpu(DType dt, const void* x, int64_t m, int64_t k, const Fp8Weight& w, void* out);

}  // namespace keel
