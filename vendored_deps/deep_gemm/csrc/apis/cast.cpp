// deep_gemm/csrc/apis/cast.cpp
// Per-token (1 x gran_k) and per-block (128 x 128) casts to e4m3 with fp32 scales (CPU).
#include "csrc/apis/cast.hpp"

#include <cmath>

#include "csrc/utils/exception.hpp"
#include "csrc/utils/fp8.hpp"
#include "csrc/utils/parallel.hpp"

namespace deep_gemm {
namespace {

constexpr float kAmaxFloor = 1e-4f;  // as upstream: an all-zero group gets a tiny, finite scale

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

float load_x(const TensorView& x, int64_t r, int64_t c) {
  const int64_t i = r * x.strides[0] + c * x.strides[1];
  return x.dtype == DType::kFloat32 ? x.ptr<const float>()[i] : bf16_to_float(x.ptr<const uint16_t>()[i]);
}

// amax / 448, or its power-of-two ceiling (UE8M0)
float scale_of(float amax, bool use_ue8m0) {
  const float s = (amax > kAmaxFloor ? amax : kAmaxFloor) / kFp8E4M3Max;  // NaN amax stays NaN
  return use_ue8m0 ? std::exp2(std::ceil(std::log2(s))) : s;
}

void check_cast_args(const char* op, const TensorView& x, const TensorView& out, const TensorView& sf, int64_t sf_rows,
                     int64_t sf_cols) {
  DG_HOST_ASSERT(x.device == Device::kCPU && out.device == Device::kCPU && sf.device == Device::kCPU, op,
                 ": only CPU tensors are supported by this build's casts");
  DG_HOST_ASSERT(x.dtype == DType::kBFloat16 || x.dtype == DType::kFloat32, op, ": x must be bfloat16 or float32, got ",
                 dtype_name(x.dtype));
  DG_HOST_ASSERT(
      out.dtype == DType::kFloat8E4M3 && out.ndim == 2 && out.sizes[0] == x.sizes[0] && out.sizes[1] == x.sizes[1], op,
      ": out must be float8_e4m3fn ", x.shape(), ", got ", dtype_name(out.dtype), " ", out.shape());
  DG_HOST_ASSERT(sf.dtype == DType::kFloat32 && sf.ndim == 2 && sf.sizes[0] == sf_rows && sf.sizes[1] == sf_cols, op,
                 ": sf must be float32 [", sf_rows, ", ", sf_cols, "], got ", dtype_name(sf.dtype), " ", sf.shape());
}

}  // namespace

void per_token_cast_to_fp8(const TensorView& x, const TensorView& out, const TensorView& sf, bool use_ue8m0,
                           int gran_k) {
  constexpr const char* op = "deep_gemm::per_token_cast_to_fp8";
  DG_HOST_ASSERT(x.ndim == 2, op, ": x must be 2-D [M, K], got ", x.shape());
  DG_HOST_ASSERT(gran_k > 0, op, ": gran_k must be positive, got ", gran_k);
  const int64_t m = x.sizes[0], k = x.sizes[1];
  const int64_t groups = ceil_div(k, gran_k);
  check_cast_args(op, x, out, sf, m, groups);
  uint8_t* o = out.ptr<uint8_t>();
  float* s = sf.ptr<float>();
  parallel_for(m, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t c0 = g * gran_k, c1 = c0 + gran_k < k ? c0 + gran_k : k;
        float amax = 0.0f;
        for (int64_t c = c0; c < c1; ++c) amax = std::fmax(amax, std::fabs(load_x(x, r, c)));
        const float scale = scale_of(amax, use_ue8m0);
        s[r * sf.strides[0] + g * sf.strides[1]] = scale;
        for (int64_t c = c0; c < c1; ++c) {
          o[r * out.strides[0] + c * out.strides[1]] = float_to_e4m3(load_x(x, r, c) / scale);
        }
      }
    }
  });
}

void per_block_cast_to_fp8(const TensorView& x, const TensorView& out, const TensorView& sf, bool use_ue8m0) {
  constexpr const char* op = "deep_gemm::per_block_cast_to_fp8";
  constexpr int64_t kBlock = 128;
  DG_HOST_ASSERT(x.ndim == 2, op, ": x must be 2-D [N, K], got ", x.shape());
  const int64_t n = x.sizes[0], k = x.sizes[1];
  const int64_t nb = ceil_div(n, kBlock), kb = ceil_div(k, kBlock);
  check_cast_args(op, x, out, sf, nb, kb);
  uint8_t* o = out.ptr<uint8_t>();
  float* s = sf.ptr<float>();
  parallel_for(nb * kb, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = (b / kb) * kBlock, c0 = (b % kb) * kBlock;
      const int64_t r1 = r0 + kBlock < n ? r0 + kBlock : n, c1 = c0 + kBlock < k ? c0 + kBlock : k;
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) amax = std::fmax(amax, std::fabs(load_x(x, r, c)));
      }
      const float scale = scale_of(amax, use_ue8m0);
      s[(b / kb) * sf.strides[0] + (b % kb) * sf.strides[1]] = scale;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c)
          o[r * out.strides[0] + c * out.strides[1]] = float_to_e4m3(load_x(x, r, c) / scale);
      }
    }
  });
}

}  // namespace deep_gemm
