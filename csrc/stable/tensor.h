// keel/csrc/stable/tensor.h
// The tensor type and the few torch stable-ABI facilities the rest of keel uses.
// Everything outside csrc/stable/ reaches torch only through headers in this folder.
#pragma once

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <cstdint>
#include <string>

#include "stable/kernel_types.h"

namespace keel {

using Tensor = torch::stable::Tensor;
using ScalarType = torch::headeronly::ScalarType;

// The shim's integer codes for the dtypes and device types keel checks, read once.
// (torch's own ScalarType conversion asks the shim for each candidate code on every call.)
struct ShimCodes {
  int32_t float32, bfloat16, float16, float64, int64;
  int32_t cpu, cuda;
};

inline const ShimCodes& shim_codes() {
  static const ShimCodes codes{aoti_torch_dtype_float32(),   aoti_torch_dtype_bfloat16(), aoti_torch_dtype_float16(),
                               aoti_torch_dtype_float64(),   aoti_torch_dtype_int64(),    aoti_torch_device_type_cpu(),
                               aoti_torch_device_type_cuda()};
  return codes;
}

// The shim's dtype code of `t` (one C call).
inline int32_t dtype_code(const Tensor& t) {
  int32_t d = 0;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_dtype(t.get(), &d));
  return d;
}

// The shim's device type code and index of `t`.
inline void device_code(const Tensor& t, int32_t* type, int32_t* index) {
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(t.get(), type));
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_index(t.get(), index));
}

// Human-readable name of a torch dtype, for error messages.
inline std::string scalar_type_name(ScalarType t) {
  switch (t) {
    case ScalarType::Float:
      return "float32";
    case ScalarType::BFloat16:
      return "bfloat16";
    case ScalarType::Half:
      return "float16";
    case ScalarType::Double:
      return "float64";
    case ScalarType::Long:
      return "int64";
    case ScalarType::Int:
      return "int32";
    case ScalarType::Short:
      return "int16";
    case ScalarType::Char:
      return "int8";
    case ScalarType::Byte:
      return "uint8";
    case ScalarType::Bool:
      return "bool";
    default:
      return "dtype#" + std::to_string(static_cast<int>(t));
  }
}

// Human-readable device of a tensor ("cpu", "cuda:0", ...).
inline std::string device_name(const Tensor& t) {
  if (t.is_cpu()) return "cpu";
  if (t.is_cuda()) return "cuda:" + std::to_string(t.get_device_index());
  return "device_type#" + std::to_string(static_cast<int>(t.device().type()));
}

// Shape as "[2, 3]" for error messages.
inline std::string shape_str(const Tensor& t) {
  std::string s = "[";
  const int64_t n = t.dim();
  for (int64_t i = 0; i < n; ++i) {
    if (i) s += ", ";
    s += std::to_string(t.size(i));
  }
  return s + "]";
}

}  // namespace keel
