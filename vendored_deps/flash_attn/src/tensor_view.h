// vendored_deps/flash_attn/src/tensor_view.h
// The fork's own tensor description (no torch here): pointer, dtype, sizes, strides in elements.
// The embedding project (keel's adapter) fills one per argument; upstream takes at::Tensor.
#pragma once

#include <cstdint>

namespace flash {

enum class DType { kFloat32, kBFloat16, kFloat16, kInt32, kOther };

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat16:
      return "float16";
    case DType::kInt32:
      return "int32";
    default:
      return "an unsupported dtype";
  }
}

struct TensorView {
  static constexpr int kMaxDims = 4;
  void* data = nullptr;
  DType dtype = DType::kOther;
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};  // in elements
  bool is_cuda = false;            // device memory: the host never reads it (its index data is checked on the device)
  int device_index = 0;            // which CUDA device (0 for host memory): every argument must share q's

  int64_t size(int i) const { return sizes[i < 0 ? i + ndim : i]; }
  int64_t stride(int i) const { return strides[i < 0 ? i + ndim : i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= sizes[i];
    return n;
  }
};

}  // namespace flash
