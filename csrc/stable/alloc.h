// keel/csrc/stable/alloc.h
// Allocation helpers: new tensors straight from the C shim (no dispatcher round trip).
#pragma once

#include <cstdint>
#include <vector>

#include "stable/tensor.h"

namespace keel {

// A new contiguous tensor with `sizes`, on `like`'s device, with the shim dtype code `dt`.
inline Tensor empty_contiguous(const std::vector<int64_t>& sizes, int32_t dt, const Tensor& like) {
  std::vector<int64_t> strides(sizes.size());
  int64_t s = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = s;
    s *= sizes[i] > 1 ? sizes[i] : 1;
  }
  int32_t device_type = 0;
  int32_t device_index = 0;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(like.get(), &device_type));
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_index(like.get(), &device_index));
  AtenTensorHandle out = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(static_cast<int64_t>(sizes.size()), sizes.data(), strides.data(), dt,
                                                  device_type, device_index, &out));
  return Tensor(out);
}

// The sizes of a tensor as a vector (for building output shapes).
inline std::vector<int64_t> sizes_of(const Tensor& t) {
  auto s = t.sizes();
  return std::vector<int64_t>(s.begin(), s.end());
}

// A new contiguous tensor with the shape, dtype and device of `t`.
inline Tensor empty_like_contiguous(const Tensor& t) { return empty_contiguous(sizes_of(t), dtype_code(t), t); }

}  // namespace keel
