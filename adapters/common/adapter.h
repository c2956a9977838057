// keel/adapters/common/adapter.h
// The machinery every adapter shares: the stable face of a vendored kernel library.
//
// Upstream kernel libraries take std::pair / std::tuple arguments and C++ `int` / `float`
// options. The stable dispatcher carries neither: TORCH_BOX has no tuple conversion, and
// for small trivially-copyable types it copies raw bytes, so an `int` parameter compiles
// and then reads the dispatcher's 64-bit value wrongly. An adapter therefore
//   1. registers schemas that split every tuple into separate arguments and take only
//      Tensor, Tensor?, int (int64_t), float (double) and bool (adapters/<dep>/bindings.cpp);
//   2. registers kernels through KEEL_ADAPTER_IMPL, which refuses at compile time any
//      parameter type outside that widened set;
//   3. narrows back to the fork's types with range checks (to_int, to_float) and rebuilds
//      the pairs before calling the fork's upstream-shaped API.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>

#include "stable/check.h"
#include "stable/library.h"
#include "stable/tensor.h"

namespace keel::adapter {

// ---- the widened parameter set ------------------------------------------------

template <typename T>
struct is_widened_scalar
    : std::bool_constant<std::is_same_v<T, int64_t> || std::is_same_v<T, double> || std::is_same_v<T, bool>> {};

template <typename T>
struct is_widened : std::bool_constant<is_widened_scalar<T>::value || std::is_same_v<T, Tensor>> {};

template <typename T>
struct is_widened<std::optional<T>> : is_widened<T> {};

// A kernel parameter as written (`const Tensor&`, `int64_t`, `std::optional<Tensor>`) is
// judged by its decayed type.
template <typename T>
inline constexpr bool is_widened_param_v = is_widened<std::remove_cv_t<std::remove_reference_t<T>>>::value;

template <typename F>
struct all_params_widened;

template <typename R, typename... Args>
struct all_params_widened<R(Args...)> : std::bool_constant<(is_widened_param_v<Args> && ...)> {};

template <typename R, typename... Args>
struct all_params_widened<R (*)(Args...)> : all_params_widened<R(Args...)> {};

// ---- range-checked narrowing back to the fork's types -----------------------------

// The fork's `int` option from the dispatcher's int64: an error, never a silent wrap.
inline int to_int(const char* op, const char* arg, int64_t v) {
  KEEL_CHECK(v >= std::numeric_limits<int>::min() && v <= std::numeric_limits<int>::max(), op, ": ", arg,
             " must fit in a 32-bit int (the vendored kernel's type), got ", v);
  return static_cast<int>(v);
}

// As to_int, for an optional int with a default.
inline int to_int(const char* op, const char* arg, std::optional<int64_t> v, int fallback) {
  return v ? to_int(op, arg, *v) : fallback;
}

// The fork's `float` option from the dispatcher's double: a finite value must stay finite
// (no silent overflow to inf); inf and nan pass through for the kernel's own checks.
inline float to_float(const char* op, const char* arg, double v) {
  KEEL_CHECK(!std::isfinite(v) || std::fabs(v) <= static_cast<double>(std::numeric_limits<float>::max()), op, ": ", arg,
             " must fit in a 32-bit float (the vendored kernel's type), got ", v);
  return static_cast<float>(v);
}

}  // namespace keel::adapter

// Registers `fn` for `name` in the enclosing KEEL_ADAPTER_LIBRARY_IMPL block, after checking
// at compile time that every parameter is one the stable dispatcher carries as-is.
#define KEEL_ADAPTER_IMPL(m, name, fn)                                                                \
  do {                                                                                                \
    static_assert(::keel::adapter::all_params_widened<std::remove_reference_t<decltype(fn)>>::value,  \
                  "keel adapter: the kernel registered for " name                                     \
                  " has a parameter type the stable dispatcher cannot carry; use only Tensor, "       \
                  "std::optional<Tensor>, int64_t, double, bool (and std::optional of the scalars)"); \
    (m).impl(name, TORCH_BOX(fn));                                                                    \
  } while (0)

// Impl block of a vendored library's namespace for this library's device (CPU in _C,
// CUDA in the _C_cuda twin, which is compiled with -DKEEL_CUDA_LIBRARY).
#define KEEL_ADAPTER_LIBRARY_IMPL(ns, m) KEEL_LIBRARY_IMPL_(ns, KEEL_IMPL_DEVICE, m)
