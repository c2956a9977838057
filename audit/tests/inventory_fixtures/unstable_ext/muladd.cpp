// A small extension written against the unstable libtorch C++ API, as most are today: the
// inventory's --fix test migrates it (the diff, then hand.json) and builds it for the stable ABI.
#include <torch/extension.h>

#include <cstdint>

at::Tensor muladd(const at::Tensor& a, const at::Tensor& b, double c) {
  TORCH_CHECK(a.numel() == b.numel(), "muladd: a and b must have as many elements");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "muladd: a and b must have one dtype");
  TORCH_CHECK(a.is_cpu() && b.is_cpu(), "muladd: CPU tensors only");
  at::Tensor a_c = a.contiguous();
  at::Tensor b_c = b.contiguous();
  at::Tensor out = torch::empty(a_c.sizes(), a_c.options());
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "muladd", [&] {
    const scalar_t* x = a_c.data_ptr<scalar_t>();
    const scalar_t* y = b_c.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    for (int64_t i = 0; i < out.numel(); i++) {
      o[i] = x[i] * y[i] + static_cast<scalar_t>(c);
    }
  });
  return out;
}

TORCH_LIBRARY(inventory_fixture, m) { m.def("muladd(Tensor a, Tensor b, float c) -> Tensor"); }

TORCH_LIBRARY_IMPL(inventory_fixture, CPU, m) { m.impl("muladd", &muladd); }
