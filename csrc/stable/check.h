// keel/csrc/stable/check.h
// Argument checks whose messages name the op, the argument and what was expected:
//   keel::rms_norm: weight must have 4096 elements, got 1024
#pragma once

#include <initializer_list>
#include <sstream>
#include <stdexcept>
#include <string>

#include "stable/tensor.h"

namespace keel::detail {

template <typename... Args>
[[noreturn]] inline void fail(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  throw std::runtime_error(os.str());
}

}  // namespace keel::detail

// KEEL_CHECK(cond, op, ": x must be ...", value) -> RuntimeError("keel::op: x must be ...")
#ifndef KEEL_CHECK
#define KEEL_CHECK(cond, ...)            \
  do {                                   \
    if (__builtin_expect(!(cond), 0)) {  \
      ::keel::detail::fail(__VA_ARGS__); \
    }                                    \
  } while (0)
#endif

namespace keel {

// dtype must be one of the floating types keel's kernels are built for.
// `also_float64`: the op has a float64 path too (only named in the message; the caller handles it).
inline DType check_float_dtype(const char* op, const char* arg, const Tensor& t, bool also_float64 = false) {
  const int32_t d = dtype_code(t);
  const ShimCodes& c = shim_codes();
  if (d == c.float32) return DType::kFloat32;
  if (d == c.bfloat16) return DType::kBFloat16;
  if (d == c.float16) return DType::kFloat16;
  detail::fail(op, ": ", arg, " must be float32, bfloat16", also_float64 ? ", float16 or float64" : " or float16",
               ", got ", scalar_type_name(t.scalar_type()));
}

inline void check_same_dtype(const char* op, const char* arg, const Tensor& t, const char* ref_arg, const Tensor& ref) {
  KEEL_CHECK(dtype_code(t) == dtype_code(ref), op, ": ", arg, " must have the dtype of ", ref_arg, " (",
             scalar_type_name(ref.scalar_type()), "), got ", scalar_type_name(t.scalar_type()));
}

inline void check_same_device(const char* op, const char* arg, const Tensor& t, const char* ref_arg,
                              const Tensor& ref) {
  int32_t tt = 0, ti = 0, rt = 0, ri = 0;
  KEEL_CHECK(aoti_torch_get_device_type(t.get(), &tt) == AOTI_TORCH_SUCCESS, op, ": ", arg,
             " must be a tensor, got an undefined tensor (None)");
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_index(t.get(), &ti));
  device_code(ref, &rt, &ri);
  KEEL_CHECK(tt == rt && ti == ri, op, ": ", arg, " must be on the device of ", ref_arg, " (", device_name(ref),
             "), got ", device_name(t));
}

inline void check_dim(const char* op, const char* arg, const Tensor& t, int64_t dim) {
  KEEL_CHECK(t.dim() == dim, op, ": ", arg, " must be ", dim, "-D, got ", t.dim(), "-D tensor of shape ", shape_str(t));
}

inline void check_min_dim(const char* op, const char* arg, const Tensor& t, int64_t dim) {
  KEEL_CHECK(t.dim() >= dim, op, ": ", arg, " must have at least ", dim, " dimension(s), got ", t.dim(),
             "-D tensor of shape ", shape_str(t));
}

inline void check_same_shape(const char* op, const char* arg, const Tensor& t, const char* ref_arg, const Tensor& ref) {
  bool same = t.dim() == ref.dim();
  for (int64_t i = 0; same && i < t.dim(); ++i) same = t.size(i) == ref.size(i);
  KEEL_CHECK(same, op, ": ", arg, " must have the shape of ", ref_arg, " ", shape_str(ref), ", got ", shape_str(t));
}

}  // namespace keel
