// keel/csrc/ops/linear.cpp
// keel::linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor   (x: [..., K], weight: [N, K] -> [..., N])
// CPU, any number of rows: keel's kernel in linear_cpu.cpp (a GEMV for decode; prefill runs it over
// blocks of kLinearRowBlock rows, each streaming the weight once), and for bf16 on a CPU with AMX the tile GEMM
// of linear_amx_cpu.cpp for every call, decode included, so CPU results depend on keel's code alone, never on the
// oneDNN version of the torch it runs on. Either kernel sums every output in one order whatever the call's row
// count (a token's logits are the same bits in a prompt call, with a cached prefix, batched or alone,
// in a decode call), which is why the kernel is chosen per process and dtype, never per row count. The CUDA library
// calls aten::linear through the dispatcher (cuBLAS), so there is no linear .cu file.
#include "ops/linear.h"

#include <optional>
#include <vector>

#include "stable/alloc.h"
#include "stable/device.h"
#include "stable/dispatcher.h"
#include "stable/layout.h"
#include "stable/library.h"
#include "stable/parallel.h"

namespace keel {
namespace {

// Checks every argument; returns the dtype shared by all of them.
DType check_linear_args(const char* op, const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias) {
  check_library_device(op, "x", x);
  const DType dt = check_float_dtype(op, "x", x);
  check_min_dim(op, "x", x, 1);
  check_same_device(op, "weight", weight, "x", x);
  check_same_dtype(op, "weight", weight, "x", x);
  const int64_t k = x.size(-1);
  KEEL_CHECK(weight.dim() == 2 && weight.size(1) == k, op, ": weight must be [N, ", k, "] to match x's last dim, got ",
             shape_str(weight));
  KEEL_CHECK(weight.stride(1) == 1 || k <= 1, op, ": weight must have unit stride along its last dim (K), got stride ",
             weight.stride(1));
  if (bias.has_value()) {
    check_same_device(op, "bias", *bias, "x", x);
    check_same_dtype(op, "bias", *bias, "x", x);
    KEEL_CHECK(bias->dim() == 1 && bias->size(0) == weight.size(0), op, ": bias must be [", weight.size(0),
               "] to match weight's rows, got ", shape_str(*bias));
  }
  return dt;
}

}  // namespace

#ifndef KEEL_CUDA_LIBRARY
void linear_cpu(DType dt, const void* x, int64_t m, int64_t k, const void* w, int64_t w_row, int64_t n,
                const void* bias, int64_t bias_stride, void* out) {
  if (m == 0 || n == 0) return;
  LinearParams p{};
  p.dtype = dt;
  // x rows are read for every weight row: in the form the kernel reads (bf16 as is for the AVX512-BF16 kernel,
  // else fp32, converted once)
  thread_local std::vector<float> xbuf;
  if (dt == DType::kBFloat16 && cpu_has_avx512bf16()) {
    p.x16 = x;
  } else if (dt == DType::kFloat32) {
    p.x = static_cast<const float*>(x);
  } else {
    xbuf.resize(static_cast<size_t>(m * k));
    dispatch_storage(dt, [&](auto tag) {
      using T = decltype(tag);
      const T* src = static_cast<const T*>(x);
      for (int64_t i = 0; i < m * k; ++i) xbuf[static_cast<size_t>(i)] = load(src + i);
    });
    p.x = xbuf.data();
  }
  p.out = out;
  p.w = w;
  p.w_row = w_row;
  p.bias = bias;
  p.bias_stride = bias_stride;
  p.m = m;
  p.n = n;
  p.k = k;
  if (p.x16 != nullptr && cpu_has_amx()) {
    // every bf16 call on AMX (linear_amx_cpu.cpp), decode rows too: the AMX and AVX512-BF16 kernels sum in
    // different orders, so a row count threshold between them would make a token's bits depend on its call.
    // x packed once into the B-tile layout, then 32-wide blocks of output features on the pool, each over all
    // rows. UNVERIFIED on AMX hardware (docs/ops.md).
    LinearAmxParams a{};
    a.p = &p;
    a.kp = (k + kAmxStepK - 1) / kAmxStepK * kAmxStepK;
    a.mp = (m + kAmxBlockM - 1) / kAmxBlockM * kAmxBlockM;
    thread_local std::vector<uint16_t> xpack;
    xpack.resize(static_cast<size_t>(a.mp * a.kp));  // pack writes every element, zeros included
    a.xpack = xpack.data();
    parallel_for(a.mp / 16, grain_for(16 * a.kp, 32768),
                 [&](int64_t b, int64_t e) { cpu_avx2::linear_amx_pack(a, b, e); });
    const int64_t blocks = (n + kAmxBlockN - 1) / kAmxBlockN;
    parallel_for(blocks, grain_for(kAmxBlockN * a.kp * a.mp, int64_t{1} << 21),
                 [&](int64_t b, int64_t e) { cpu_avx2::linear_amx_cols(a, b, e); });
    return;
  }
  // each chunk streams >= 64 KB of weight (small layers run inline, skipping the pool hand-off)
  const int64_t row_bytes = k * (dt == DType::kFloat32 ? 4 : 2);
  // blocks of rows: a block's x rows stay in cache while each weight row streams past them once
  const int64_t out_elem = dt == DType::kFloat32 ? 4 : 2;
  for (int64_t m0 = 0; m0 < m; m0 += kLinearRowBlock) {
    LinearParams q = p;
    q.m = m - m0 < kLinearRowBlock ? m - m0 : kLinearRowBlock;
    if (q.x) q.x += m0 * k;
    if (q.x16) q.x16 = static_cast<const bf16_t*>(q.x16) + m0 * k;
    q.out = static_cast<char*>(p.out) + m0 * n * out_elem;
    parallel_for(n, grain_for(row_bytes * q.m, 65536), [&](int64_t b, int64_t e) { cpu::linear_cols(q, b, e); });
  }
}
#endif

Tensor linear(const Tensor& x, const Tensor& weight, std::optional<Tensor> bias) {
  constexpr const char* op = "keel::linear";
  const DType dt = check_linear_args(op, x, weight, bias);
#ifndef KEEL_CUDA_LIBRARY
  const int64_t m = leading_numel(x, x.dim() - 1);
  const int64_t k = x.size(-1);
  const int64_t n = weight.size(0);
  std::vector<int64_t> out_sizes = sizes_of(x);
  out_sizes.back() = n;
  Tensor out = empty_contiguous(out_sizes, dtype_code(x), x);
  if (m == 0 || n == 0) return out;
  const void* xp = x.data_ptr();
  thread_local std::vector<uint16_t> xrows;  // a strided x's rows, contiguous (as 16-bit or 32-bit elements)
  if (!x.is_contiguous()) {
    xrows.resize(static_cast<size_t>(m * k * (dt == DType::kFloat32 ? 2 : 1)));
    dispatch_storage(dt, [&](auto tag) {
      using T = decltype(tag);
      copy_rows<T>(op, "x", x, reinterpret_cast<T*>(xrows.data()), k, [](const T* v) { return *v; });
    });
    xp = xrows.data();
  }
  linear_cpu(dt, xp, m, k, weight.data_ptr(), weight.stride(0), n, bias.has_value() ? bias->data_ptr() : nullptr,
             bias.has_value() ? bias->stride(0) : 0, out.data_ptr());
  return out;
#else
  (void)dt;
  Tensor out = call_aten<Tensor>("aten::linear", "", x, weight, bias);
  return out.is_contiguous() ? out : torch::stable::contiguous(out);
#endif
}

}  // namespace keel

KEEL_LIBRARY_IMPL(m) { m.impl("linear", TORCH_BOX(&keel::linear)); }
