// keel/csrc/stable/dispatcher.h
// Calling an ATen op through the dispatcher when torch offers no stable wrapper for it.
#pragma once

#include <array>
#include <cstdint>

#include "stable/tensor.h"

namespace keel {

// Calls `name.overload` with `args` boxed on a StableIValue stack and returns the
// first output converted to `Ret`. Every argument type must have a stable conversion.
template <typename Ret, typename... Args>
Ret call_aten(const char* name, const char* overload, const Args&... args) {
  constexpr size_t n = sizeof...(Args) > 0 ? sizeof...(Args) : 1;
  std::array<StableIValue, n> stack{torch::stable::detail::from(args)...};
  TORCH_ERROR_CODE_CHECK(torch_call_dispatcher(name, overload, stack.data(), TORCH_ABI_VERSION));
  return torch::stable::detail::to<Ret>(stack[0]);
}

// torch's MemOverlap answer for `t`: whether two elements share one memory location.
enum class InternalOverlap : int64_t { kNo = 0, kYes = 1, kTooHard = 2 };

// Cheap answers locally; asks ATen (aten::_debug_has_internal_overlap) for the rest.
inline InternalOverlap internal_overlap(const Tensor& t) {
  if (t.is_contiguous()) return InternalOverlap::kNo;
  const int64_t n = t.dim();
  for (int64_t i = 0; i < n; ++i) {
    if (t.size(i) > 1 && t.stride(i) == 0) return InternalOverlap::kYes;
  }
  return static_cast<InternalOverlap>(call_aten<int64_t>("aten::_debug_has_internal_overlap", "", t));
}

}  // namespace keel
