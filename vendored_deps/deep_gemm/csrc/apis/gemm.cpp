// deep_gemm/csrc/apis/gemm.cpp
// Argument checks of fp8_gemm_nt / bf16_gemm_nt and the dispatch to the CPU kernels (one ISA
// build chosen at run time, columns of D spread over the parallel-for hook) or the CUDA launcher.
#include "csrc/apis/gemm.hpp"

#include <vector>

#include "csrc/apis/runtime.hpp"
#include "csrc/cpu/kernels.hpp"
#include "csrc/cuda/launch.hpp"
#include "csrc/utils/exception.hpp"
#include "csrc/utils/fp8.hpp"

namespace deep_gemm {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct E4M3Table {  // exact value of every e4m3fn byte
  float v[256];
  E4M3Table() {
    for (int i = 0; i < 256; ++i) v[i] = e4m3_to_float(static_cast<uint8_t>(i));
  }
};

void check_2d(const char* op, const char* arg, const TensorView& t, int64_t rows, int64_t cols) {
  DG_HOST_ASSERT(t.ndim == 2 && t.sizes[0] == rows && t.sizes[1] == cols, op, ": ", arg, " must be [", rows, ", ", cols,
                 "], got ", t.shape());
}

void check_dtype(const char* op, const char* arg, const TensorView& t, DType want) {
  DG_HOST_ASSERT(t.dtype == want, op, ": ", arg, " must be ", dtype_name(want), ", got ", dtype_name(t.dtype));
}

void check_out_dtype(const char* op, const char* arg, const TensorView& t) {
  DG_HOST_ASSERT(t.dtype == DType::kBFloat16 || t.dtype == DType::kFloat32, op, ": ", arg,
                 " must be bfloat16 or float32, got ", dtype_name(t.dtype));
}

void check_same_device(const char* op, const char* arg, const TensorView& t, const TensorView& ref) {
  DG_HOST_ASSERT(t.device == ref.device && t.device_index == ref.device_index, op, ": ", arg,
                 " must be on the device of a");
}

void check_k_major(const char* op, const char* arg, const TensorView& t) {
  DG_HOST_ASSERT(t.ndim == 2 && (t.strides[1] == 1 || t.sizes[1] <= 1), op, ": ", arg,
                 " must be K-major (unit stride along its last dim), got strides [", t.strides[0], ", ", t.strides[1],
                 "]");
}

// Shared by both GEMMs: a [m, k], b [n, k], d and c [m, n].
void check_operands(const char* op, const TensorView& a, const TensorView& b, const TensorView& d,
                    const std::optional<TensorView>& c) {
  DG_HOST_ASSERT(a.ndim == 2, op, ": a must be 2-D [M, K], got ", a.shape());
  DG_HOST_ASSERT(b.ndim == 2 && b.sizes[1] == a.sizes[1], op, ": b must be [N, ", a.sizes[1], "] (K of a), got ",
                 b.shape());
  check_k_major(op, "a", a);
  check_k_major(op, "b", b);
  check_2d(op, "d", d, a.sizes[0], b.sizes[0]);
  check_out_dtype(op, "d", d);
  check_same_device(op, "b", b, a);
  check_same_device(op, "d", d, a);
  if (c) {
    check_2d(op, "c", *c, a.sizes[0], b.sizes[0]);
    check_out_dtype(op, "c", *c);
    check_same_device(op, "c", *c, a);
  }
}

cpu::GemmParams output_params(const TensorView& b, const TensorView& d, const std::optional<TensorView>& c, int64_t m,
                              int64_t n, int64_t k) {
  cpu::GemmParams p;
  p.b = b.data;
  p.b_dtype = b.dtype;
  p.ldb = b.strides[0];
  p.m = m;
  p.n = n;
  p.k = k;
  p.d = d.data;
  p.d_dtype = d.dtype;
  p.ldd0 = d.strides[0];
  p.ldd1 = d.strides[1];
  if (c) {
    p.c = c->data;
    p.c_dtype = c->dtype;
    p.ldc0 = c->strides[0];
    p.ldc1 = c->strides[1];
  }
  return p;
}

void run_cpu(const cpu::GemmParams& p) {
  void (*kernel)(const cpu::GemmParams&, int64_t, int64_t) = cpu_base::gemm_nt_rows;
  switch (cpu_isa()) {
    case CpuIsa::kAVX512:
      kernel = cpu_avx512::gemm_nt_rows;
      break;
    case CpuIsa::kAVX2:
      kernel = cpu_avx2::gemm_nt_rows;
      break;
    default:
      break;
  }
  // each chunk streams at least 64 KB of B
  const int64_t row_bytes = p.k * element_size(p.b_dtype) * (p.m > 8 ? p.m / 8 : 1);
  const int64_t grain = row_bytes >= 65536 ? 1 : 65536 / (row_bytes > 0 ? row_bytes : 1);
  parallel_for(p.n, grain, [&](int64_t b, int64_t e) { kernel(p, b, e); });
}

// D = C (or 0) when K == 0; nothing when the output is empty
bool early_return(const cpu::GemmParams& p) {
  if (p.m == 0 || p.n == 0) return true;
  if (p.k != 0) return false;
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      float v = 0.0f;
      if (p.c) {
        v = p.c_dtype == DType::kFloat32 ? static_cast<const float*>(p.c)[i * p.ldc0 + j * p.ldc1]
                                         : bf16_to_float(static_cast<const uint16_t*>(p.c)[i * p.ldc0 + j * p.ldc1]);
      }
      if (p.d_dtype == DType::kFloat32) {
        static_cast<float*>(p.d)[i * p.ldd0 + j * p.ldd1] = v;
      } else {
        static_cast<uint16_t*>(p.d)[i * p.ldd0 + j * p.ldd1] = float_to_bf16(v);
      }
    }
  }
  return true;
}

cuda::GemmArgs cuda_args(const cpu::GemmParams& p, const TensorView& a) {
  cuda::GemmArgs g;
  g.fp8 = p.b_dtype == DType::kFloat8E4M3;
  g.a = a.data;
  g.lda = a.strides[0];
  g.b = p.b;
  g.ldb = p.ldb;
  g.sfb = p.sfb;
  g.sfb_s0 = p.sfb_s0;
  g.sfb_s1 = p.sfb_s1;
  g.sfb_gran_n = p.sfb_gran_n;
  g.m = p.m;
  g.n = p.n;
  g.k = p.k;
  g.d = p.d;
  g.d_fp32 = p.d_dtype == DType::kFloat32;
  g.ldd0 = p.ldd0;
  g.ldd1 = p.ldd1;
  g.c = p.c;
  g.c_fp32 = p.c_dtype == DType::kFloat32;
  g.ldc0 = p.ldc0;
  g.ldc1 = p.ldc1;
  return g;
}

void run_cuda(const char* op, cuda::GemmArgs g, void* stream) {
  const cuda::GemmLauncher launch = cuda::gemm_launcher();
  DG_HOST_ASSERT(launch != nullptr, op, ": got CUDA tensors, but this build has no CUDA kernels");
  g.op = op;  // named in a launch error
  launch(g, stream);
}

}  // namespace

void fp8_gemm_nt(const std::pair<TensorView, TensorView>& a, const std::pair<TensorView, TensorView>& b,
                 const TensorView& d, const std::optional<TensorView>& c,
                 std::optional<std::tuple<int, int, int>> recipe, bool disable_ue8m0_cast, void* stream) {
  constexpr const char* op = "deep_gemm::fp8_gemm_nt";
  (void)disable_ue8m0_cast;  // fp32 scales only: nothing to cast
  const TensorView& av = a.first;
  const TensorView& sfa = a.second;
  const TensorView& bv = b.first;
  const TensorView& sfb = b.second;
  int64_t gran_n = 128;
  if (recipe) {
    const auto [rm, rn, rk] = *recipe;
    DG_HOST_ASSERT(rm == 1 && (rn == 128 || rn == 1) && rk == 128, op,
                   ": recipe must be (1, 128, 128) (128x128-block B scales) or (1, 1, 128) (1x128 B scales), got (", rm,
                   ", ", rn, ", ", rk, ")");
    gran_n = rn;
  }
  check_dtype(op, "a", av, DType::kFloat8E4M3);
  check_dtype(op, "b", bv, DType::kFloat8E4M3);
  check_operands(op, av, bv, d, c);
  const int64_t m = av.sizes[0], n = bv.sizes[0], k = av.sizes[1];
  check_dtype(op, "sfa", sfa, DType::kFloat32);
  check_dtype(op, "sfb", sfb, DType::kFloat32);
  check_2d(op, "sfa", sfa, m, ceil_div(k, 128));
  check_2d(op, "sfb", sfb, ceil_div(n, gran_n), ceil_div(k, 128));
  check_same_device(op, "sfa", sfa, av);
  check_same_device(op, "sfb", sfb, av);

  cpu::GemmParams p = output_params(bv, d, c, m, n, k);
  p.sfb = sfb.ptr<const float>();
  p.sfb_s0 = sfb.strides[0];
  p.sfb_s1 = sfb.strides[1];
  p.sfb_gran_n = gran_n;
  if (av.device == Device::kCUDA) {
    cuda::GemmArgs g = cuda_args(p, av);
    g.sfa = sfa.ptr<const float>();
    g.sfa_s0 = sfa.strides[0];
    g.sfa_s1 = sfa.strides[1];
    return run_cuda(op, g, stream);
  }
  if (early_return(p)) return;
  static const E4M3Table table;
  const int64_t lda = ceil_div(k, 128) * 128;
  const uint8_t* ap = av.ptr<const uint8_t>();
  const float* sp = sfa.ptr<const float>();
  p.lda = lda;
  // A dequantized once (its per-token scales folded in): A is small next to B in decode
  std::vector<float> a32(static_cast<size_t>(m * lda), 0.0f);
  for (int64_t i = 0; i < m; ++i) {
    const uint8_t* row = ap + i * av.strides[0];
    for (int64_t j0 = 0; j0 < k; j0 += 128) {
      const float s = sp[i * sfa.strides[0] + (j0 / 128) * sfa.strides[1]];
      const int64_t j1 = j0 + 128 < k ? j0 + 128 : k;
      for (int64_t j = j0; j < j1; ++j) a32[i * lda + j] = table.v[row[j]] * s;
    }
  }
  p.a = a32.data();
  std::vector<uint16_t> a16;
  std::vector<float> sfa_c;
  if (cpu_isa() == CpuIsa::kAVX512) {
    // also A as exact bf16 (times 2^64) and its scales, for the kernel's bf16 dot products
    a16.assign(static_cast<size_t>(m * lda), 0);
    sfa_c.resize(static_cast<size_t>(m * (lda / 128)));
    for (int64_t i = 0; i < m; ++i) {
      const uint8_t* row = ap + i * av.strides[0];
      for (int64_t j = 0; j < k; ++j) a16[i * lda + j] = float_to_bf16(table.v[row[j]] * cpu::kBf16DotAShift);
      for (int64_t g = 0; g < lda / 128; ++g) sfa_c[i * (lda / 128) + g] = sp[i * sfa.strides[0] + g * sfa.strides[1]];
    }
    p.a16 = a16.data();
    p.sfa = sfa_c.data();
  }
  run_cpu(p);
}

void bf16_gemm_nt(const TensorView& a, const TensorView& b, const TensorView& d, const std::optional<TensorView>& c,
                  void* stream) {
  constexpr const char* op = "deep_gemm::bf16_gemm_nt";
  check_dtype(op, "a", a, DType::kBFloat16);
  check_dtype(op, "b", b, DType::kBFloat16);
  check_operands(op, a, b, d, c);
  const int64_t m = a.sizes[0], n = b.sizes[0], k = a.sizes[1];
  cpu::GemmParams p = output_params(b, d, c, m, n, k);
  if (a.device == Device::kCUDA) return run_cuda(op, cuda_args(p, a), stream);
  if (early_return(p)) return;
  const int64_t lda = ceil_div(k, 128) * 128;
  std::vector<float> a32(static_cast<size_t>(m * lda), 0.0f);
  const uint16_t* ap = a.ptr<const uint16_t>();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < k; ++j) a32[i * lda + j] = bf16_to_float(ap[i * a.strides[0] + j]);
  }
  p.a = a32.data();
  p.lda = lda;
  run_cpu(p);
}

}  // namespace deep_gemm
