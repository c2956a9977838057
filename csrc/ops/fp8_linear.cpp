// keel/csrc/ops/fp8_linear.cpp
// keel::fp8_linear(Tensor x, Tensor qweight, Tensor scale, Tensor? bias, Tensor? special_rows=None) -> Tensor
// keel::fp8_special_rows(Tensor qweight) -> Tensor
//   x [..., K] (float32, bfloat16 or float16), qweight [N, K] float8_e4m3fn, scale fp32 [N, ceil(K/128)]
//   (one per row and 128-wide K block) or [ceil(N/128), ceil(K/128)] (128x128 blocks) -> [..., N] in x's dtype.
// Weight-only FP8 on the CPU: x is widened to fp32 once per call, the weight decoded in registers
// (fp8_linear_cpu.cpp); bf16 x on a CPU with AMX: the tile kernel (fp8_linear_amx_cpu.cpp) for every call. Each
// output of a process is summed in one order whatever the call's row count or other rows. The CUDA library
// refuses: CUDA runs FP8 through keel.vendored.deep_gemm.
#include "ops/fp8_linear.h"
#include "ops/fp8_linear_amx.h"
#include "ops/projection.h"

#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "stable/alloc.h"
#include "stable/device.h"
#include "stable/layout.h"
#include "stable/library.h"
#include "stable/parallel.h"

namespace keel {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The fields of an e4m3 weight that the GEMV's and the AMX kernel's parameters share.
template <typename P>
void set_weight(P& p, const Fp8Weight& w) {
  p.w = w.w;
  p.w_row = w.w_row;
  p.scale = w.scale;
  p.scale_rows = w.scale_rows;
  p.scale_s0 = w.scale_s0;
  p.scale_s1 = w.scale_s1;
  p.bias = static_cast<decltype(p.bias)>(w.bias);
  p.bias_stride = w.bias_stride;
  p.n = w.n;
}

// Checks every argument; returns the dtype of x (and bias, and the output).
DType check_fp8_linear_args(const char* op, const Tensor& x, const Tensor& qweight, const Tensor& scale,
                            const std::optional<Tensor>& bias) {
  check_library_device(op, "x", x);
  const DType dt = check_float_dtype(op, "x", x);
  check_min_dim(op, "x", x, 1);
  check_same_device(op, "qweight", qweight, "x", x);
  check_same_device(op, "scale", scale, "x", x);
  KEEL_CHECK(dtype_code(qweight) == aoti_torch_dtype_float8_e4m3fn(), op, ": qweight must be float8_e4m3fn, got ",
             scalar_type_name(qweight.scalar_type()));
  KEEL_CHECK(dtype_code(scale) == shim_codes().float32, op, ": scale must be float32, got ",
             scalar_type_name(scale.scalar_type()));
  const int64_t k = x.size(-1);
  KEEL_CHECK(qweight.dim() == 2 && qweight.size(1) == k, op, ": qweight must be [N, ", k,
             "] to match x's last dim, got ", shape_str(qweight));
  KEEL_CHECK(qweight.stride(1) == 1 || k <= 1, op,
             ": qweight must have unit stride along its last dim (K), got stride ", qweight.stride(1));
  const int64_t n = qweight.size(0);
  const int64_t kb = ceil_div(k, kFp8BlockK);
  KEEL_CHECK(scale.dim() == 2 && scale.size(1) == kb && (scale.size(0) == n || scale.size(0) == ceil_div(n, 128)), op,
             ": scale must be [", n, ", ", kb, "] (per row) or [", ceil_div(n, 128), ", ", kb,
             "] (per 128 rows) for qweight ", shape_str(qweight), ", got ", shape_str(scale));
  if (bias.has_value()) {
    check_same_device(op, "bias", *bias, "x", x);
    check_same_dtype(op, "bias", *bias, "x", x);
    KEEL_CHECK(bias->dim() == 1 && bias->size(0) == n, op, ": bias must be [", n, "] to match qweight's rows, got ",
               shape_str(*bias));
  }
  return dt;
}

// bf16 x on AMX (fp8_linear_amx_cpu.cpp): x packed once into the B-tile layout, then 32-wide blocks of output
// features on the pool, each decoding its weight panel once for all rows.
void fp8_linear_amx_call(const uint16_t* x, int64_t m, int64_t k, const Fp8Weight& w, void* out) {
  Fp8AmxParams a{};
  a.x = x;
  a.x_row = k;
  a.kp = ceil_div(k, kFp8BlockK) * kFp8BlockK;
  a.mp = ceil_div(m, kFp8AmxBlockM) * kFp8AmxBlockM;
  thread_local std::vector<uint16_t> xpack;
  xpack.resize(static_cast<size_t>(a.mp * a.kp));  // pack writes every element, zeros included
  a.xpack = xpack.data();
  set_weight(a, w);
  a.out = static_cast<bf16_t*>(out);
  a.m = m;
  a.k = k;
  parallel_for(a.mp / 16, grain_for(16 * a.kp, 32768),
               [&](int64_t b, int64_t e) { cpu_avx2::fp8_linear_amx_pack(a, b, e); });
  parallel_for(ceil_div(w.n, kFp8AmxBlockN), grain_for(kFp8AmxBlockN * a.kp * a.mp, int64_t{1} << 21),
               [&](int64_t b, int64_t e) { cpu_avx2::fp8_linear_amx_cols(a, b, e); });
}

// Bit 7 of each byte of the result is set where that byte of v is an e4m3 byte the fast (bf16) decode cannot take:
// a subnormal (exponent 0, mantissa not 0) or a NaN (S.1111.111); zeros are fine (the set of fp8_linear_cpu.cpp's
// special_bytes). With m = b & 0x7F, no per-byte sum below carries into the next byte: m + 1 reaches 0x80 only for
// NaN (0x7F), m + 0x7F has bit 7 for m != 0, (m & 0x78) + 0x78 for a nonzero exponent.
inline uint64_t special_e4m3_x8(uint64_t v) {
  constexpr uint64_t kLow7 = 0x7F7F7F7F7F7F7F7Full, kHigh = 0x8080808080808080ull;
  constexpr uint64_t kOnes = 0x0101010101010101ull, kExp = 0x7878787878787878ull;
  const uint64_t m = v & kLow7;
  const uint64_t nan = m + kOnes;
  const uint64_t nonzero = m + kLow7;
  const uint64_t exp = (m & kExp) + kExp;
  return ((nonzero & ~exp) | nan) & kHigh;
}

// The `len` (<= 8) bytes at p, `stride` apart, packed into one word; zeros past them (not special).
inline uint64_t gather8(const uint8_t* p, int64_t stride, int64_t len) {
  uint64_t v = 0;
  for (int64_t j = 0; j < len; ++j) v |= static_cast<uint64_t>(p[j * stride]) << (8 * j);
  return v;
}

inline void check_special_rows(const char* op, const Tensor& special_rows, const Tensor& qweight) {
  check_same_device(op, "special_rows", special_rows, "qweight", qweight);
  KEEL_CHECK(dtype_code(special_rows) == aoti_torch_dtype_bool(), op, ": special_rows must be bool, got ",
             scalar_type_name(special_rows.scalar_type()));
  KEEL_CHECK(special_rows.dim() == 1 && special_rows.size(0) == qweight.size(0), op, ": special_rows must be [",
             qweight.size(0), "] (one per qweight row: fp8_special_rows(qweight)), got ", shape_str(special_rows));
}

}  // namespace

Tensor fp8_special_rows(const Tensor& qweight) {
  constexpr const char* op = "keel::fp8_special_rows";
  check_library_device(op, "qweight", qweight);
  KEEL_CHECK(dtype_code(qweight) == aoti_torch_dtype_float8_e4m3fn(), op, ": qweight must be float8_e4m3fn, got ",
             scalar_type_name(qweight.scalar_type()));
  KEEL_CHECK(qweight.dim() == 2, op, ": qweight must be [N, K], got ", shape_str(qweight));
#ifdef KEEL_CUDA_LIBRARY
  KEEL_CHECK(false, op, ": qweight must be a CPU tensor, got ", device_name(qweight));
  return qweight;
#else
  const int64_t n = qweight.size(0);
  const int64_t k = qweight.size(1);
  Tensor out = empty_contiguous({n}, aoti_torch_dtype_bool(), qweight);
  const auto* w = static_cast<const uint8_t*>(qweight.data_ptr());
  const int64_t s0 = qweight.stride(0);
  const int64_t s1 = qweight.stride(1);
  auto* dst = static_cast<uint8_t*>(out.data_ptr());
  parallel_for(n, grain_for(k, 65536), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const uint8_t* row = w + r * s0;
      uint64_t acc = 0;
      int64_t i = 0;
      if (s1 == 1) {
        for (; i + 8 <= k; i += 8) {
          uint64_t v;
          std::memcpy(&v, row + i, sizeof(v));
          acc |= special_e4m3_x8(v);
        }
      }
      for (; i < k; i += 8) acc |= special_e4m3_x8(gather8(row + i * s1, s1, k - i < 8 ? k - i : 8));  // tail, strided
      dst[r] = acc != 0 ? 1 : 0;
    }
  });
  return out;
#endif
}

#ifndef KEEL_CUDA_LIBRARY
namespace {

// bf16 x on AVX512-BF16: its bf16 copy for vdpbf16ps, each row scaled by a power of two (exact), from the fp32 rows
// in p.x. Decided per row (x16_ok), never per call: a row's path, hence its bits, must not depend on the other rows
// of the call. Sets p.x16 and its companions unless every row takes the exact path.
void prepare_x16(Fp8LinearParams& p, int64_t m, int64_t k) {
  thread_local std::vector<uint16_t> x16buf;
  thread_local std::vector<float> x16_unscale, x_scale;
  thread_local std::vector<uint8_t> x16_ok;
  x16buf.assign(static_cast<size_t>(m * p.kp), 0);
  x16_unscale.resize(static_cast<size_t>(m));
  x_scale.resize(static_cast<size_t>(m));
  x16_ok.resize(static_cast<size_t>(m));
  bool any = false;
  for (int64_t r = 0; r < m; ++r) {
    const float* xr = p.x + r * p.kp;
    float mx = 0.0f;
    bool ok = true;
    for (int64_t i = 0; i < k; ++i) {
      const float a = std::fabs(xr[i]);
      mx = a > mx ? a : mx;
      if (!(a <= 3.4e38f)) ok = false;  // inf or NaN: the exact path propagates them
    }
    int ex = 0;
    std::frexp(mx, &ex);                     // mx = f * 2^ex, f in [0.5, 1)
    const int e = mx == 0.0f ? 0 : 65 - ex;  // max |x| * 2^e in [2^64, 2^65)
    // keeps both factors finite, normal fp32 numbers: x_scale = 2^(e - 112) >= 2^-126 and
    // x16_unscale = 2^(120 - e) <= 2^127 (rows of |x| >= 2^72 take the exact path)
    if (e < -7 || e > 127) ok = false;
    x16_ok[r] = ok ? 1 : 0;
    if (!ok) {  // the exact path: its sums in units of 1 (the fp16 decode's 2^-8 folded into x_scale)
      x16_unscale[r] = 1.0f;
      x_scale[r] = kFp8Unit;
      continue;
    }
    any = true;
    const float f = std::ldexp(1.0f, e);
    uint16_t* dst = x16buf.data() + r * p.kp;
    for (int64_t i = 0; i < k; ++i) {
      uint32_t u;
      const float v = xr[i] * f;  // exact: x is bf16, the factor a power of two
      std::memcpy(&u, &v, sizeof(u));
      dst[i] = static_cast<uint16_t>(u >> 16);
    }
    x16_unscale[r] = std::ldexp(1.0f, 120 - e);
    x_scale[r] = std::ldexp(1.0f, e - 112);
  }
  if (any) {  // else every row takes the exact path, whose bits these rows would get here too
    p.x16 = x16buf.data();
    p.x16_unscale = x16_unscale.data();
    p.x_scale = x_scale.data();
    p.x16_ok = x16_ok.data();
  }
}

}  // namespace

void fp8_linear_cpu(DType dt, const void* x, int64_t m, int64_t k, const Fp8Weight& w, void* out) {
  if (m == 0 || w.n == 0) return;
  if (dt == DType::kBFloat16 && k > 0 && cpu_has_amx()) {
    // every bf16 call on AMX, decode rows too: the AMX kernel and the GEMV sum in different orders, so a row count
    // threshold between them would make a token's bits depend on its call. UNVERIFIED on AMX hardware (docs/ops.md).
    fp8_linear_amx_call(static_cast<const uint16_t*>(x), m, k, w, out);
    return;
  }
  Fp8LinearParams p{};
  p.dtype = dt;
  p.kp = ceil_div(k, kFp8BlockK) * kFp8BlockK;
  // x in fp32, rows padded with zeros to whole K blocks: converted once, read for every weight row
  thread_local std::vector<float> xbuf;
  xbuf.assign(static_cast<size_t>(m * p.kp), 0.0f);
  dispatch_storage(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* src = static_cast<const T*>(x);
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t i = 0; i < k; ++i) xbuf[static_cast<size_t>(r * p.kp + i)] = load(src + r * k + i);
    }
  });
  p.x = xbuf.data();
  if (dt == DType::kBFloat16 && cpu_has_avx512bf16() && k > 0) prepare_x16(p, m, k);
  set_weight(p, w);
  p.row_special = w.row_special;
  p.row_special_stride = w.row_special_stride;
  p.k = k;
  p.out = out;
  const int64_t out_elem = dt == DType::kFloat32 ? 4 : 2;
  for (int64_t m0 = 0; m0 < m; m0 += kFp8RowBlock) {
    Fp8LinearParams q = p;
    q.m = m - m0 < kFp8RowBlock ? m - m0 : kFp8RowBlock;
    q.x = p.x + m0 * p.kp;
    if (q.x16) {
      q.x16 += m0 * p.kp;
      q.x16_unscale += m0;
      q.x_scale += m0;
      q.x16_ok += m0;
    }
    q.out = static_cast<char*>(p.out) + m0 * w.n * out_elem;
    // each chunk decodes >= 32 KB of weight (small layers run inline, skipping the pool hand-off)
    parallel_for(w.n, grain_for(k * q.m, 32768), [&](int64_t b, int64_t e) { cpu::fp8_linear_cols(q, b, e); });
  }
}
#endif

Fp8Weight fp8_weight(const Tensor& qweight, const Tensor& scale, const std::optional<Tensor>& bias,
                     const std::optional<Tensor>& special_rows) {
  Fp8Weight w{};
  w.n = qweight.size(0);
  w.w = static_cast<const uint8_t*>(qweight.data_ptr());
  w.w_row = qweight.stride(0);
  w.scale = static_cast<const float*>(scale.data_ptr());
  w.scale_rows = scale.size(0) == w.n ? 1 : 128;
  w.scale_s0 = scale.stride(0);
  w.scale_s1 = scale.stride(1);
  w.bias = bias.has_value() ? bias->data_ptr() : nullptr;
  w.bias_stride = bias.has_value() ? bias->stride(0) : 0;
  if (special_rows.has_value()) {
    w.row_special = static_cast<const uint8_t*>(special_rows->data_ptr());
    w.row_special_stride = special_rows->stride(0);
  }
  return w;
}

Tensor fp8_linear(const Tensor& x, const Tensor& qweight, const Tensor& scale, std::optional<Tensor> bias,
                  std::optional<Tensor> special_rows) {
  constexpr const char* op = "keel::fp8_linear";
#ifdef KEEL_CUDA_LIBRARY
  KEEL_CHECK(false, op, ": x must be a CPU tensor, got ", device_name(x),
             " (CUDA runs FP8 through keel.vendored.deep_gemm.fp8_gemm_nt)");
  (void)qweight;
  (void)scale;
  (void)bias;
  (void)special_rows;
  return x;
#else
  const DType dt = check_fp8_linear_args(op, x, qweight, scale, bias);
  if (special_rows.has_value()) check_special_rows(op, *special_rows, qweight);
  const int64_t m = leading_numel(x, x.dim() - 1);
  const int64_t k = x.size(-1);
  const int64_t n = qweight.size(0);
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
  fp8_linear_cpu(dt, xp, m, k, fp8_weight(qweight, scale, bias, special_rows), out.data_ptr());
  return out;
#endif
}

}  // namespace keel

KEEL_LIBRARY_IMPL(m) {
  m.impl("fp8_linear", TORCH_BOX(&keel::fp8_linear));
  m.impl("fp8_special_rows", TORCH_BOX(&keel::fp8_special_rows));
}
