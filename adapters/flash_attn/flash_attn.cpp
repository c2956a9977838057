// adapters/flash_attn/flash_attn.cpp
// keel_flash_attn's kernels: stable tensors -> the fork's TensorViews, widened scalars narrowed back
// (range-checked) to the fork's `int` / `float`, the window pair rebuilt, then the fork's
// upstream-shaped API. The fork's own errors come back prefixed with the op name. Compiled into
// both libraries: the CUDA twin (-DKEEL_CUDA_LIBRARY) passes device tensors and the current stream.
#include <optional>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "common/adapter.h"
#include "src/flash_api.h"
#include "stable/alloc.h"
#include "stable/check.h"
#include "stable/cpu_isa_level.h"
#include "stable/device.h"
#include "stable/library.h"
#include "stable/parallel.h"

namespace keel::flash_attn_adapter {
namespace {

constexpr const char* kVarlen = "keel_flash_attn::varlen_fwd";
constexpr const char* kKvcache = "keel_flash_attn::fwd_kvcache";

// keel's thread pool behind the fork's parallel-for hook: the fork's items (a sequence's query block and kv
// heads) differ in cost by their keys, so the threads take them one by one, the last (a batch's prompts, a
// causal prompt's later blocks) first.
void pool_for(int64_t n, int64_t grain, void* ctx, flash::ParallelBody body) {
  keel::parallel_for_dynamic(n, grain, [&](int64_t b, int64_t e) { body(ctx, b, e); });
}

// Once per process: the hook, and the CPU build cap from KEEL_CPU_ISA (stable/cpu_isa_level.h, as keel's own
// kernels): base and avx2 cap the fork there; avx512, amx (the fork has no AMX kernels) and auto leave its best
// (AVX-512) build. An unknown value is an error naming KEEL_CPU_ISA (retried, and refused, at every call).
void install() {
  static const bool done = [] {
    const int cap = keel::cpu_isa_cap();  // 0 base, 1 avx2, 2 avx512, 3 amx (and auto)
    flash::set_parallel_for(&pool_for, static_cast<int>(torch::stable::get_num_threads()));
    flash::set_cpu_isa_limit(cap <= 0   ? flash::CpuIsa::kBase
                             : cap == 1 ? flash::CpuIsa::kAvx2
                                        : flash::CpuIsa::kAvx512);
    return true;
  }();
  (void)done;
}

flash::DType fork_dtype(const Tensor& t) {
  static const int32_t int32 = aoti_torch_dtype_int32();
  const int32_t d = dtype_code(t);
  const ShimCodes& c = shim_codes();
  if (d == c.float32) return flash::DType::kFloat32;
  if (d == c.bfloat16) return flash::DType::kBFloat16;
  if (d == c.float16) return flash::DType::kFloat16;
  if (d == int32) return flash::DType::kInt32;
  return flash::DType::kOther;
}

// An argument as the fork's view; `index`: an int32 index tensor (cu_seqlens, block_table, ...).
flash::TensorView view(const char* op, const char* arg, const Tensor& t, bool index = false) {
  check_library_device(op, arg, t);
  KEEL_CHECK(t.dim() >= 1 && t.dim() <= flash::TensorView::kMaxDims, op, ": ", arg,
             " must have 1 to 4 dimensions, got ", t.dim(), "-D tensor of shape ", shape_str(t));
  flash::TensorView v;
  v.dtype = fork_dtype(t);
  KEEL_CHECK(!index || v.dtype == flash::DType::kInt32, op, ": ", arg, " must be int32, got ",
             scalar_type_name(t.scalar_type()));
  KEEL_CHECK(v.dtype != flash::DType::kOther, op, ": ", arg, " must be float32, bfloat16 or float16, got ",
             scalar_type_name(t.scalar_type()));
  v.data = t.data_ptr();
  v.is_cuda = t.is_cuda();
  v.device_index = v.is_cuda ? t.get_device_index() : 0;
  v.ndim = static_cast<int>(t.dim());
  for (int i = 0; i < v.ndim; ++i) {
    v.sizes[i] = t.size(i);
    v.strides[i] = t.stride(i);
  }
  return v;
}

std::optional<flash::TensorView> view(const char* op, const char* arg, const std::optional<Tensor>& t, bool index) {
  if (!t) return std::nullopt;
  return view(op, arg, *t, index);
}

// The fork's scalar options, narrowed from the schema's widened ones (range-checked), with
// upstream's window pair rebuilt from the split schema's two ints.
struct Options {
  std::pair<int, int> window;
  float softmax_scale, softcap;
  int num_splits;
};

Options narrow(const char* op, int64_t window_left, int64_t window_right, double softmax_scale, double softcap,
               int64_t num_splits) {
  return Options{{adapter::to_int(op, "window_left", window_left), adapter::to_int(op, "window_right", window_right)},
                 adapter::to_float(op, "softmax_scale", softmax_scale),
                 adapter::to_float(op, "softcap", softcap),
                 adapter::to_int(op, "num_splits", num_splits)};
}

// Runs a call into the fork; its errors (argument checks, a CUDA launch failure) come back as
// "<op>: <message>".
template <typename F>
void call_fork(const char* op, const F& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    detail::fail(op, ": ", e.what());
  } catch (const std::runtime_error& e) {
    detail::fail(op, ": ", e.what());
  }
}

}  // namespace

Tensor varlen_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens_q,
                  std::optional<Tensor> cu_seqlens_k, std::optional<Tensor> seqused_k,
                  std::optional<Tensor> block_table, int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
                  bool causal, int64_t window_left, int64_t window_right, double softcap, int64_t num_splits) {
  install();
  const auto qv = view(kVarlen, "q", q);
  const auto kv = view(kVarlen, "k", k);
  const auto vv = view(kVarlen, "v", v);
  const auto cu_q = view(kVarlen, "cu_seqlens_q", cu_seqlens_q, true);
  const auto cu_k = view(kVarlen, "cu_seqlens_k", cu_seqlens_k, true);
  const auto used = view(kVarlen, "seqused_k", seqused_k, true);
  const auto table = view(kVarlen, "block_table", block_table, true);
  const int mq = adapter::to_int(kVarlen, "max_seqlen_q", max_seqlen_q);
  const int mk = adapter::to_int(kVarlen, "max_seqlen_k", max_seqlen_k);
  const Options o = narrow(kVarlen, window_left, window_right, softmax_scale, softcap, num_splits);
  Tensor out = empty_contiguous(sizes_of(q), dtype_code(q), q);
  const auto ov = view(kVarlen, "out", out);
  LaunchContext ctx(q);  // CUDA: device guard + current stream; CPU: nothing
  call_fork(kVarlen, [&] {
    flash::mha_varlen_fwd(qv, kv, vv, ov, cu_q, cu_k, used, table, mq, mk, o.softmax_scale, causal, o.window.first,
                          o.window.second, o.softcap, o.num_splits, ctx.stream());
  });
  return out;
}

Tensor fwd_kvcache(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, std::optional<Tensor> cache_seqlens,
                   std::optional<Tensor> block_table, double softmax_scale, bool causal, int64_t window_left,
                   int64_t window_right, double softcap, int64_t num_splits) {
  install();
  const auto qv = view(kKvcache, "q", q);
  const auto kv = view(kKvcache, "k_cache", k_cache);
  const auto vv = view(kKvcache, "v_cache", v_cache);
  const auto lens = view(kKvcache, "cache_seqlens", cache_seqlens, true);
  const auto table = view(kKvcache, "block_table", block_table, true);
  const Options o = narrow(kKvcache, window_left, window_right, softmax_scale, softcap, num_splits);
  Tensor out = empty_contiguous(sizes_of(q), dtype_code(q), q);
  const auto ov = view(kKvcache, "out", out);
  LaunchContext ctx(q);
  call_fork(kKvcache, [&] {
    flash::mha_fwd_kvcache(qv, kv, vv, lens, table, ov, o.softmax_scale, causal, o.window.first, o.window.second,
                           o.softcap, o.num_splits, ctx.stream());
  });
  return out;
}

#ifndef KEEL_CUDA_LIBRARY
int64_t cpu_isa(const Tensor& probe) {
  install();
  return static_cast<int64_t>(flash::cpu_isa());
}

std::tuple<int64_t, int64_t> last_splitkv_stats(const Tensor& probe) {
  const flash::SplitKvStats s = flash::last_splitkv_stats();
  return {static_cast<int64_t>(s.num_splits), s.partials_combined};
}
#endif

}  // namespace keel::flash_attn_adapter

KEEL_ADAPTER_LIBRARY_IMPL(keel_flash_attn, m) {
  KEEL_ADAPTER_IMPL(m, "varlen_fwd", &keel::flash_attn_adapter::varlen_fwd);
  KEEL_ADAPTER_IMPL(m, "fwd_kvcache", &keel::flash_attn_adapter::fwd_kvcache);
#ifndef KEEL_CUDA_LIBRARY
  KEEL_ADAPTER_IMPL(m, "cpu_isa", &keel::flash_attn_adapter::cpu_isa);
  KEEL_ADAPTER_IMPL(m, "last_splitkv_stats", &keel::flash_attn_adapter::last_splitkv_stats);
#endif
}
