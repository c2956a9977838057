// keel/adapters/deep_gemm/deep_gemm.cpp
// The stable-ABI kernels of keel_deep_gemm: check arguments, describe each tensor with the
// fork's TensorView, narrow the widened ints back to the fork's `int` (range-checked), rebuild
// upstream's pairs and tuple, and call the fork. The fork's errors (deep_gemm::...) come back as
// keel_deep_gemm::... errors. Compiled into both libraries (CUDA twin: -DKEEL_CUDA_LIBRARY).
#include <optional>
#include <tuple>
#include <utility>

#include "common/adapter.h"
#include "csrc/apis/cast.hpp"
#include "csrc/apis/gemm.hpp"
#include "csrc/apis/runtime.hpp"
#include "csrc/utils/exception.hpp"
#include "stable/alloc.h"
#include "stable/cpu_isa_level.h"
#include "stable/device.h"
#include "stable/parallel.h"

namespace keel::deep_gemm_adapter {
namespace dg = ::deep_gemm;

// keel's thread pool (torch's) behind the fork's parallel-for hook
void keel_parallel_for(int64_t n, int64_t grain, void* ctx, void (*body)(void*, int64_t, int64_t)) {
  keel::parallel_for(n, grain, [&](int64_t b, int64_t e) { body(ctx, b, e); });
}

[[maybe_unused]] const bool installed = [] {
  dg::set_parallel_for(&keel_parallel_for);
  return true;
}();

// The fork's CPU build cap from KEEL_CPU_ISA (stable/cpu_isa_level.h, as keel's own kernels), once, before the
// first call into the fork: base and avx2 cap it there; avx512, amx (the fork has no AMX kernels) and auto
// leave its best (AVX-512) build. An unknown value is an error naming KEEL_CPU_ISA (at the op, not at load).
void install_isa_cap() {
  static const bool done = [] {
    const int cap = keel::cpu_isa_cap();  // 0 base, 1 avx2, 2 avx512, 3 amx (and auto)
    dg::set_max_cpu_isa(cap <= 0 ? dg::CpuIsa::kBase : cap == 1 ? dg::CpuIsa::kAVX2 : dg::CpuIsa::kAVX512);
    return true;
  }();
  (void)done;
}

dg::DType fork_dtype(const Tensor& t) {
  static const int32_t fp8 = aoti_torch_dtype_float8_e4m3fn();
  const int32_t d = dtype_code(t);
  const ShimCodes& c = shim_codes();
  if (d == fp8) return dg::DType::kFloat8E4M3;
  if (d == c.bfloat16) return dg::DType::kBFloat16;
  if (d == c.float32) return dg::DType::kFloat32;
  return dg::DType::kOther;
}

// `t` as the fork's view, after the checks only the adapter can make (device kind, rank)
dg::TensorView view(const char* op, const char* arg, const Tensor& t) {
  check_library_device(op, arg, t);
  KEEL_CHECK(t.dim() <= dg::TensorView::kMaxDims, op, ": ", arg, " must have at most ", dg::TensorView::kMaxDims,
             " dimensions, got ", t.dim());
  KEEL_CHECK(fork_dtype(t) != dg::DType::kOther, op, ": ", arg, " must be float8_e4m3fn, bfloat16 or float32, got ",
             scalar_type_name(t.scalar_type()));
  dg::TensorView v;
  v.data = t.data_ptr();
  v.dtype = fork_dtype(t);
  v.device = t.is_cuda() ? dg::Device::kCUDA : dg::Device::kCPU;
  v.device_index = t.is_cuda() ? t.get_device_index() : 0;
  v.ndim = static_cast<int>(t.dim());
  for (int i = 0; i < v.ndim; ++i) {
    v.sizes[i] = t.size(i);
    v.strides[i] = t.stride(i);
  }
  return v;
}

std::optional<dg::TensorView> view(const char* op, const char* arg, const std::optional<Tensor>& t) {
  if (!t) return std::nullopt;
  return view(op, arg, *t);
}

// Runs a call into the fork; its DGException ("deep_gemm::op: ...") becomes "keel_deep_gemm::op: ..."
template <typename F>
void call_fork(const F& f) {
  install_isa_cap();
  try {
    f();
  } catch (const dg::DGException& e) {
    throw std::runtime_error(std::string("keel_") + e.what());
  }
}

void fp8_gemm_nt(const Tensor& a, const Tensor& sfa, const Tensor& b, const Tensor& sfb, const Tensor& d,
                 std::optional<Tensor> c, std::optional<int64_t> recipe_m, std::optional<int64_t> recipe_n,
                 std::optional<int64_t> recipe_k, bool disable_ue8m0_cast) {
  constexpr const char* op = "keel_deep_gemm::fp8_gemm_nt";
  const bool any = recipe_m || recipe_n || recipe_k;
  KEEL_CHECK(!any || (recipe_m && recipe_n && recipe_k), op,
             ": recipe_m, recipe_n and recipe_k must be given together (upstream's recipe tuple)");
  std::optional<std::tuple<int, int, int>> recipe;
  if (any) {
    // one statement each: the order of function arguments is unspecified, and the first bad one is named
    const int rm = adapter::to_int(op, "recipe_m", *recipe_m);
    const int rn = adapter::to_int(op, "recipe_n", *recipe_n);
    const int rk = adapter::to_int(op, "recipe_k", *recipe_k);
    recipe = std::make_tuple(rm, rn, rk);
  }
  const std::pair<dg::TensorView, dg::TensorView> pa{view(op, "a", a), view(op, "sfa", sfa)};
  const std::pair<dg::TensorView, dg::TensorView> pb{view(op, "b", b), view(op, "sfb", sfb)};
  const dg::TensorView vd = view(op, "d", d);
  const std::optional<dg::TensorView> vc = view(op, "c", c);
  LaunchContext ctx(a);
  call_fork([&] { dg::fp8_gemm_nt(pa, pb, vd, vc, recipe, disable_ue8m0_cast, ctx.stream()); });
}

void bf16_gemm_nt(const Tensor& a, const Tensor& b, const Tensor& d, std::optional<Tensor> c) {
  constexpr const char* op = "keel_deep_gemm::bf16_gemm_nt";
  const dg::TensorView va = view(op, "a", a), vb = view(op, "b", b), vd = view(op, "d", d);
  const std::optional<dg::TensorView> vc = view(op, "c", c);
  LaunchContext ctx(a);
  call_fork([&] { dg::bf16_gemm_nt(va, vb, vd, vc, ctx.stream()); });
}

// New (e4m3 values, fp32 scales [rows, cols]) for x [M, K]
std::tuple<Tensor, Tensor> cast_outputs(const Tensor& x, int64_t sf_rows, int64_t sf_cols) {
  Tensor out = empty_contiguous({x.size(0), x.size(1)}, aoti_torch_dtype_float8_e4m3fn(), x);
  Tensor sf = empty_contiguous({sf_rows, sf_cols}, shim_codes().float32, x);
  return {out, sf};
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::tuple<Tensor, Tensor> per_token_cast_to_fp8(const Tensor& x, bool use_ue8m0, int64_t gran_k) {
  constexpr const char* op = "keel_deep_gemm::per_token_cast_to_fp8";
  const int gk = adapter::to_int(op, "gran_k", gran_k);
  KEEL_CHECK(gk > 0, op, ": gran_k must be positive, got ", gran_k);
  check_dim(op, "x", x, 2);
  const dg::TensorView vx = view(op, "x", x);
  auto [out, sf] = cast_outputs(x, x.size(0), ceil_div(x.size(1), gk));
  const dg::TensorView vo = view(op, "out", out), vs = view(op, "sf", sf);
  LaunchContext ctx(x);  // CUDA: device guard + current stream; CPU: nothing
  call_fork([&] { dg::per_token_cast_to_fp8(vx, vo, vs, use_ue8m0, gk, ctx.stream()); });
  return {out, sf};
}

std::tuple<Tensor, Tensor> per_block_cast_to_fp8(const Tensor& x, bool use_ue8m0) {
  constexpr const char* op = "keel_deep_gemm::per_block_cast_to_fp8";
  check_dim(op, "x", x, 2);
  const dg::TensorView vx = view(op, "x", x);
  auto [out, sf] = cast_outputs(x, ceil_div(x.size(0), 128), ceil_div(x.size(1), 128));
  const dg::TensorView vo = view(op, "out", out), vs = view(op, "sf", sf);
  LaunchContext ctx(x);
  call_fork([&] { dg::per_block_cast_to_fp8(vx, vo, vs, use_ue8m0, ctx.stream()); });
  return {out, sf};
}

}  // namespace keel::deep_gemm_adapter

KEEL_ADAPTER_LIBRARY_IMPL(keel_deep_gemm, m) {
  using namespace keel::deep_gemm_adapter;
  KEEL_ADAPTER_IMPL(m, "fp8_gemm_nt", &fp8_gemm_nt);
  KEEL_ADAPTER_IMPL(m, "bf16_gemm_nt", &bf16_gemm_nt);
  // the casts: CPU loops in _C, the fork's CUDA kernels (csrc/cuda/cast.cu) in the CUDA twin
  KEEL_ADAPTER_IMPL(m, "per_token_cast_to_fp8", &per_token_cast_to_fp8);
  KEEL_ADAPTER_IMPL(m, "per_block_cast_to_fp8", &per_block_cast_to_fp8);
}
