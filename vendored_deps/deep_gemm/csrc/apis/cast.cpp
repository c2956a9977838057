// deep_gemm/csrc/apis/cast.cpp
// Per-token (1 x gran_k) and per-block (128 x 128) casts to e4m3 with fp32 scales: argument checks,
// then the CPU loops below or the CUDA kernels (csrc/cuda/cast.cu), which compute the same bytes.
#include "csrc/apis/cast.hpp"

#include <cmath>
#include <limits>

#include "csrc/cuda/launch.hpp"
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

// amax / 448, or the power of two at or above it (UE8M0); amax ignores NaN (fmax), so it is never NaN
float scale_of(float amax, bool use_ue8m0) {
  const float s = (amax > kAmaxFloor ? amax : kAmaxFloor) / kFp8E4M3Max;
  return use_ue8m0 ? ue8m0_ceil(s) : s;
}

void check_same_device(const char* op, const char* arg, const TensorView& t, const TensorView& x) {
  DG_HOST_ASSERT(t.device == x.device && t.device_index == x.device_index, op, ": ", arg,
                 " must be on the device of x");
}

void check_cast_args(const char* op, const TensorView& x, const TensorView& out, const TensorView& sf, int64_t sf_rows,
                     int64_t sf_cols) {
  DG_HOST_ASSERT(x.dtype == DType::kBFloat16 || x.dtype == DType::kFloat32, op, ": x must be bfloat16 or float32, got ",
                 dtype_name(x.dtype));
  DG_HOST_ASSERT(
      out.dtype == DType::kFloat8E4M3 && out.ndim == 2 && out.sizes[0] == x.sizes[0] && out.sizes[1] == x.sizes[1], op,
      ": out must be float8_e4m3fn ", x.shape(), ", got ", dtype_name(out.dtype), " ", out.shape());
  DG_HOST_ASSERT(sf.dtype == DType::kFloat32 && sf.ndim == 2 && sf.sizes[0] == sf_rows && sf.sizes[1] == sf_cols, op,
                 ": sf must be float32 [", sf_rows, ", ", sf_cols, "], got ", dtype_name(sf.dtype), " ", sf.shape());
  check_same_device(op, "out", out, x);
  check_same_device(op, "sf", sf, x);
}

// The CUDA kernels' arguments for one cast of x into out / sf with gran_rows x gran_cols groups.
cuda::CastArgs cuda_cast_args(const char* op, const TensorView& x, const TensorView& out, const TensorView& sf,
                              int64_t gran_rows, int64_t gran_cols, bool use_ue8m0) {
  cuda::CastArgs a;
  a.x = x.data;
  a.x_fp32 = x.dtype == DType::kFloat32;
  a.rows = x.sizes[0];
  a.cols = x.sizes[1];
  a.xs0 = x.strides[0];
  a.xs1 = x.strides[1];
  a.out = out.ptr<uint8_t>();
  a.os0 = out.strides[0];
  a.os1 = out.strides[1];
  a.sf = sf.ptr<float>();
  a.ss0 = sf.strides[0];
  a.ss1 = sf.strides[1];
  a.gran_rows = gran_rows;
  a.gran_cols = gran_cols;
  a.use_ue8m0 = use_ue8m0;
  a.op = op;
  return a;
}

void run_cuda_cast(const char* op, const cuda::CastArgs& a, void* stream) {
  const cuda::CastLauncher launch = cuda::cast_launcher();
  DG_HOST_ASSERT(launch != nullptr, op, ": got CUDA tensors, but this build has no CUDA kernels");
  if (a.rows == 0 || a.cols == 0) return;  // no group: nothing to launch
  const int64_t groups = ceil_div(a.rows, a.gran_rows) * ceil_div(a.cols, a.gran_cols);
  DG_HOST_ASSERT(groups <= std::numeric_limits<int32_t>::max(), op, ": ", groups,
                 " scale groups are more than one CUDA launch covers (2^31 - 1)");
  launch(a, stream);
}

}  // namespace

void per_token_cast_to_fp8(const TensorView& x, const TensorView& out, const TensorView& sf, bool use_ue8m0, int gran_k,
                           void* stream) {
  constexpr const char* op = "deep_gemm::per_token_cast_to_fp8";
  DG_HOST_ASSERT(x.ndim == 2, op, ": x must be 2-D [M, K], got ", x.shape());
  DG_HOST_ASSERT(gran_k > 0, op, ": gran_k must be positive, got ", gran_k);
  const int64_t m = x.sizes[0], k = x.sizes[1];
  const int64_t groups = ceil_div(k, gran_k);
  check_cast_args(op, x, out, sf, m, groups);
  if (x.device == Device::kCUDA) return run_cuda_cast(op, cuda_cast_args(op, x, out, sf, 1, gran_k, use_ue8m0), stream);
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

void per_block_cast_to_fp8(const TensorView& x, const TensorView& out, const TensorView& sf, bool use_ue8m0,
                           void* stream) {
  constexpr const char* op = "deep_gemm::per_block_cast_to_fp8";
  constexpr int64_t kBlock = 128;
  DG_HOST_ASSERT(x.ndim == 2, op, ": x must be 2-D [N, K], got ", x.shape());
  const int64_t n = x.sizes[0], k = x.sizes[1];
  const int64_t nb = ceil_div(n, kBlock), kb = ceil_div(k, kBlock);
  check_cast_args(op, x, out, sf, nb, kb);
  if (x.device == Device::kCUDA) {
    return run_cuda_cast(op, cuda_cast_args(op, x, out, sf, kBlock, kBlock, use_ue8m0), stream);
  }
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
