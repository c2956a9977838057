// deep_gemm/csrc/utils/tensor_view.hpp
// The fork's own tensor view: pointer, dtype, device, sizes and strides (in elements).
// Upstream takes torch::Tensor; this fork sees no torch, so whoever calls it (keel's adapter)
// describes each tensor with one of these.
#pragma once

#include <cstdint>
#include <string>

namespace deep_gemm {

enum class DType : int { kFloat8E4M3 = 0, kBFloat16 = 1, kFloat32 = 2, kOther = 3 };
enum class Device : int { kCPU = 0, kCUDA = 1 };

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat8E4M3:
      return "float8_e4m3fn";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat32:
      return "float32";
    default:
      return "an unsupported dtype";
  }
}

inline int64_t element_size(DType t) {
  switch (t) {
    case DType::kFloat8E4M3:
      return 1;
    case DType::kBFloat16:
      return 2;
    case DType::kFloat32:
      return 4;
    default:
      return 0;
  }
}

struct TensorView {
  static constexpr int kMaxDims = 4;
  void* data = nullptr;
  DType dtype = DType::kOther;
  Device device = Device::kCPU;
  int device_index = 0;
  int ndim = 0;
  int64_t sizes[kMaxDims] = {0, 0, 0, 0};
  int64_t strides[kMaxDims] = {0, 0, 0, 0};

  int64_t size(int d) const { return sizes[d < 0 ? d + ndim : d]; }
  int64_t stride(int d) const { return strides[d < 0 ? d + ndim : d]; }
  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }

  std::string shape() const {
    std::string s = "[";
    for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
    return s + "]";
  }
};

}  // namespace deep_gemm
