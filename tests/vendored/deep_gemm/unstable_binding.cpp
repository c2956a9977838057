// tests/vendored/deep_gemm/unstable_binding.cpp — TEST ONLY, never shipped.
// The fork bound the way upstream-style projects bind it: torch/library.h (the unstable C++ API,
// at::Tensor), upstream's (Tensor, Tensor) tuple arguments, and the kernel's own `int` recipe
// passed straight through. It works, and keel's audit must call the library UNSTABLE: it depends
// on mangled libtorch/libc10 C++ symbols that change between torch releases. That is the reason
// adapters/deep_gemm exists.
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "csrc/apis/gemm.hpp"

namespace {

deep_gemm::TensorView view(const at::Tensor& t) {
  deep_gemm::TensorView v;
  v.data = t.data_ptr();
  v.dtype = t.scalar_type() == at::kFloat8_e4m3fn ? deep_gemm::DType::kFloat8E4M3
            : t.scalar_type() == at::kBFloat16    ? deep_gemm::DType::kBFloat16
            : t.scalar_type() == at::kFloat       ? deep_gemm::DType::kFloat32
                                                  : deep_gemm::DType::kOther;
  v.ndim = static_cast<int>(t.dim());
  for (int i = 0; i < v.ndim; ++i) {
    v.sizes[i] = t.size(i);
    v.strides[i] = t.stride(i);
  }
  return v;
}

void fp8_gemm_nt(std::tuple<at::Tensor, at::Tensor> a, std::tuple<at::Tensor, at::Tensor> b, at::Tensor d,
                 std::optional<at::Tensor> c, int64_t recipe_k) {
  std::optional<deep_gemm::TensorView> vc;
  if (c) vc = view(*c);
  deep_gemm::fp8_gemm_nt({view(std::get<0>(a)), view(std::get<1>(a))}, {view(std::get<0>(b)), view(std::get<1>(b))},
                         view(d), vc, std::make_tuple(1, 128, static_cast<int>(recipe_k)));
}

}  // namespace

TORCH_LIBRARY(deep_gemm_unstable, m) {
  m.def("fp8_gemm_nt((Tensor, Tensor) a, (Tensor, Tensor) b, Tensor(a!) d, Tensor? c, int recipe_k) -> ()");
  m.impl("fp8_gemm_nt", c10::DispatchKey::CPU, &fp8_gemm_nt);
}
