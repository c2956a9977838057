// deep_gemm/csrc/utils/exception.hpp
// Host-side checks. As upstream, the macros are defined only when the embedding project has
// not defined them, so it can route failures to its own error type.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace deep_gemm {

class DGException : public std::runtime_error {
 public:
  explicit DGException(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename... Args>
[[noreturn]] inline void fail(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  throw DGException(os.str());
}
}  // namespace detail

}  // namespace deep_gemm

// DG_HOST_ASSERT(cond, "deep_gemm::fp8_gemm_nt: d must be ...", value): throws DGException
#ifndef DG_HOST_ASSERT
#define DG_HOST_ASSERT(cond, ...)             \
  do {                                        \
    if (__builtin_expect(!(cond), 0)) {       \
      ::deep_gemm::detail::fail(__VA_ARGS__); \
    }                                         \
  } while (0)
#endif

#ifndef DG_HOST_UNREACHABLE
#define DG_HOST_UNREACHABLE(...) ::deep_gemm::detail::fail(__VA_ARGS__)
#endif
