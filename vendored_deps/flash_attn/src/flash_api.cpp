// vendored_deps/flash_attn/src/flash_api.cpp
// Argument checks, parameter setup (set_params_fprop / set_params_splitkv as upstream names them),
// the split-K choice (on the CPU: none unless asked) and the choice of CPU build. Messages name the argument.
#include "flash_api.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/flash_fwd_cpu.h"

namespace flash {
namespace {

template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

#define FLASH_REQUIRE(cond, ...) FLASH_CHECK(cond, cat(__VA_ARGS__))

ParallelFor g_parallel_for = nullptr;
CudaLauncher g_cuda_launcher = nullptr;
int g_num_threads = 1;
std::atomic<int> g_isa_limit{static_cast<int>(CpuIsa::kAvx512)};
thread_local SplitKvStats t_last_stats;

CpuIsa supported_isa() {
  static const CpuIsa best = [] {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                        __builtin_cpu_supports("avx512bf16");
    return avx512 ? CpuIsa::kAvx512 : avx2 ? CpuIsa::kAvx2 : CpuIsa::kBase;
  }();
  return best;
}

std::string shape(const TensorView& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) s += (i ? ", " : "") + std::to_string(t.sizes[i]);
  return s + "]";
}

void check_float(const char* name, const TensorView& t, int ndim) {
  FLASH_REQUIRE(t.dtype == DType::kFloat32 || t.dtype == DType::kBFloat16 || t.dtype == DType::kFloat16, name,
                " must be float32, bfloat16 or float16, got ", dtype_name(t.dtype));
  FLASH_REQUIRE(t.ndim == ndim, name, " must be ", ndim, "-D, got shape ", shape(t));
  FLASH_REQUIRE(t.stride(-1) == 1 || t.size(-1) == 1, name, " must have a contiguous last dimension, got strides",
                " with stride(-1) = ", t.stride(-1));
}

std::string device_str(const TensorView& t) { return t.is_cuda ? "cuda:" + std::to_string(t.device_index) : "cpu"; }

// Every argument on q's device (upstream: CHECK_DEVICE): a CUDA kernel given a pointer of another
// GPU would read that GPU's memory through peer access, or fault.
void check_device(const char* name, const TensorView& t, const TensorView& q) {
  FLASH_REQUIRE(t.is_cuda == q.is_cuda && t.device_index == q.device_index, name, " must be on the device of q (",
                device_str(q), "), got ", device_str(t));
}

void check_device(const char* name, const std::optional<TensorView>& t, const TensorView& q) {
  if (t) check_device(name, *t, q);
}

void check_same(const char* name, const TensorView& t, const char* ref_name, const TensorView& ref) {
  FLASH_REQUIRE(t.dtype == ref.dtype, name, " must have the dtype of ", ref_name, " (", dtype_name(ref.dtype),
                "), got ", dtype_name(t.dtype));
}

const int* int_vector(const char* name, const TensorView& t, int64_t n) {
  FLASH_REQUIRE(t.dtype == DType::kInt32, name, " must be int32, got ", dtype_name(t.dtype));
  FLASH_REQUIRE(t.ndim == 1 && t.size(0) == n, name, " must be 1-D with ", n, " elements, got shape ", shape(t));
  FLASH_REQUIRE(n <= 1 || t.stride(0) == 1, name, " must be contiguous");
  return static_cast<const int*>(t.data);
}

void check_heads(const TensorView& q, const TensorView& k, int head_dim_index) {
  const int64_t h = q.size(-2), h_k = k.size(-2), d = q.size(-1);
  FLASH_REQUIRE(h_k > 0 && h % h_k == 0, "number of heads in q (", h, ") must be a multiple of the kv heads (", h_k,
                ")");
  FLASH_REQUIRE(h / h_k <= 256, "at most 256 query heads per kv head are supported, got ", h / h_k);
  FLASH_REQUIRE(d > 0 && d % 8 == 0 && d <= 256, "head_size must be a positive multiple of 8 up to 256, got ", d);
  FLASH_REQUIRE(k.size(head_dim_index) == d, "k must have head_size ", d, ", got shape ", shape(k));
}

void check_kv_pair(const TensorView& k, const TensorView& v) {
  bool same = k.ndim == v.ndim;
  for (int i = 0; same && i < k.ndim; ++i) same = k.sizes[i] == v.sizes[i];
  FLASH_REQUIRE(same, "v must have the shape of k ", shape(k), ", got ", shape(v));
}

// Every block a sequence uses must be a block of the cache.
void check_block_table(const TensorView& bt, int b, const int* seqlens_k, int page, int num_blocks) {
  FLASH_REQUIRE(bt.dtype == DType::kInt32, "block_table must be int32, got ", dtype_name(bt.dtype));
  FLASH_REQUIRE(bt.ndim == 2 && bt.size(0) == b, "block_table must be [batch_size=", b, ", max_blocks], got shape ",
                shape(bt));
  FLASH_REQUIRE(bt.size(1) <= 1 || bt.stride(1) == 1, "block_table must have a contiguous last dimension");
  if (bt.is_cuda) return;  // device memory: not read here
  const int* t = static_cast<const int*>(bt.data);
  for (int i = 0; i < b; ++i) {
    const int64_t used = (int64_t(seqlens_k[i]) + page - 1) / page;
    FLASH_REQUIRE(used <= bt.size(1), "sequence ", i, " has ", seqlens_k[i],
                  " keys, more than its block_table row holds (", bt.size(1), " blocks of ", page, ")");
    for (int64_t j = 0; j < used; ++j) {
      const int blk = t[i * bt.stride(0) + j];
      FLASH_REQUIRE(blk >= 0 && blk < num_blocks, "block_table[", i, "][", j, "] = ", blk, " is outside the cache's ",
                    num_blocks, " blocks");
    }
  }
}

void set_qkv_strides(Flash_fwd_params& params, const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out, bool batch) {
  const int o = batch ? 1 : 0;  // batch mode: dim 0 is the batch
  params.q_ptr = q.data;
  params.k_ptr = k.data;
  params.v_ptr = v.data;
  params.o_ptr = out.data;
  params.q_row_stride = q.stride(o);
  params.q_head_stride = q.stride(o + 1);
  params.o_row_stride = out.stride(o);
  params.o_head_stride = out.stride(o + 1);
  params.q_batch_stride = batch ? q.stride(0) : 0;
  params.o_batch_stride = batch ? out.stride(0) : 0;
  params.k_row_stride = k.stride(-3);
  params.k_head_stride = k.stride(-2);
  params.v_row_stride = v.stride(-3);
  params.v_head_stride = v.stride(-2);
  params.k_batch_stride = k.ndim == 4 ? k.stride(0) : 0;
  params.v_batch_stride = v.ndim == 4 ? v.stride(0) : 0;
}

// Upstream's set_params_fprop: sizes, scale, softcap convention and mask normalization.
void set_params_fprop(Flash_fwd_params& params, const TensorView& q, const TensorView& k, int b, int seqlen_q,
                      int seqlen_k, float softmax_scale, bool is_causal, int window_size_left, int window_size_right,
                      float softcap) {
  params.b = b;
  params.h = int(q.size(-2));
  params.h_k = int(k.size(-2));
  params.h_h_k_ratio = params.h / params.h_k;
  params.d = int(q.size(-1));
  params.seqlen_q = seqlen_q;
  params.seqlen_k = seqlen_k;
  params.dtype = q.dtype;
  params.is_bf16 = q.dtype == DType::kBFloat16;
  FLASH_REQUIRE(std::isfinite(softmax_scale), "softmax_scale must be finite, got ", softmax_scale);
  FLASH_REQUIRE(std::isfinite(softcap) && softcap >= 0.f, "softcap must be finite and >= 0, got ", softcap);
  if (softcap > 0.f) {  // scores = softcap * tanh(q.k * softmax_scale / softcap)
    params.softcap = softmax_scale / softcap;
    params.scale_softmax = softcap;
  } else {
    params.softcap = 0.f;
    params.scale_softmax = softmax_scale;
  }
  // as upstream: a window past the keys is no window; causal is the (any, 0) window
  if (window_size_left >= seqlen_k) window_size_left = -1;
  if (window_size_right >= seqlen_k) window_size_right = -1;
  if (window_size_left < 0) window_size_left = -1;
  if (window_size_right < 0) window_size_right = -1;
  if (is_causal) window_size_right = 0;
  params.window_size_left = window_size_left;
  params.window_size_right = window_size_right;
  params.is_causal = window_size_left < 0 && window_size_right == 0;
}

void run(Flash_fwd_params& params, int num_splits, int block_m_hint, bool cuda, void* stream) {
  FLASH_REQUIRE(num_splits >= 0 && num_splits <= 128, "num_splits must be in [0, 128], got ", num_splits);
  if (cuda) {
    FLASH_REQUIRE(g_cuda_launcher != nullptr, "device tensors given, but this build has no CUDA kernels");
    params.num_splits = 1;  // no split-K on CUDA: every value of num_splits computes the same
    g_cuda_launcher(params, stream);
    t_last_stats = SplitKvStats{1, 0};
    return;
  }
  // num_splits 0 (auto) never splits along the keys on the CPU: a split merges partial softmaxes, which changes a
  // query's bits, and upstream's heuristic would choose it from the batch, the thread count and the context length
  // (a query's output must be the same bits in a prefill, with a cached prefix, batched or alone, and as
  // a decode query). The kernel spreads the work over kv heads instead (cpu_kv_heads_per_item); an explicit
  // num_splits > 1 still splits, as asked.
  (void)block_m_hint;
  params.num_splits = num_splits > 0 ? num_splits : 1;
  std::vector<float> oaccum, lseaccum;
  if (params.num_splits > 1) {  // set_params_splitkv: fp32 partials per split
    oaccum.resize(size_t(params.num_splits) * params.total_q * params.h * params.d);
    lseaccum.resize(size_t(params.num_splits) * params.total_q * params.h);
    params.oaccum_ptr = oaccum.data();
    params.softmax_lseaccum_ptr = lseaccum.data();
  }
  const CpuRun cpu{g_parallel_for, g_num_threads};
  int64_t combined = 0;
  switch (cpu_isa()) {
    case CpuIsa::kAvx512:
      combined = cpu_avx512::run_mha_fwd(params, cpu);
      break;
    case CpuIsa::kAvx2:
      combined = cpu_avx2::run_mha_fwd(params, cpu);
      break;
    default:
      combined = cpu_base::run_mha_fwd(params, cpu);
      break;
  }
  t_last_stats = SplitKvStats{params.num_splits, combined};
}

}  // namespace

void set_parallel_for(ParallelFor fn, int num_threads) {
  g_parallel_for = fn;
  g_num_threads = std::max(1, num_threads);
}

void set_cuda_launcher(CudaLauncher fn) { g_cuda_launcher = fn; }

void set_cpu_isa_limit(CpuIsa limit) { g_isa_limit.store(static_cast<int>(limit)); }

CpuIsa cpu_isa() { return static_cast<CpuIsa>(std::min(static_cast<int>(supported_isa()), g_isa_limit.load())); }

SplitKvStats last_splitkv_stats() { return t_last_stats; }

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx2:
      return "avx2";
    default:
      return "base";
  }
}

void mha_varlen_fwd(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                    const TensorView& cu_seqlens_q, const std::optional<TensorView>& cu_seqlens_k,
                    const std::optional<TensorView>& seqused_k, const std::optional<TensorView>& block_table,
                    int max_seqlen_q, int max_seqlen_k, float softmax_scale, bool is_causal, int window_size_left,
                    int window_size_right, float softcap, int num_splits, void* stream) {
  t_last_stats = SplitKvStats{};
  const bool paged = block_table.has_value();
  const bool cuda = q.is_cuda;
  check_device("k", k, q);
  check_device("v", v, q);
  check_device("out", out, q);
  check_device("cu_seqlens_q", cu_seqlens_q, q);
  check_device("cu_seqlens_k", cu_seqlens_k, q);
  check_device("seqused_k", seqused_k, q);
  check_device("block_table", block_table, q);
  check_float("q", q, 3);
  check_float("k", k, paged ? 4 : 3);
  check_float("v", v, paged ? 4 : 3);
  check_same("k", k, "q", q);
  check_same("v", v, "q", q);
  check_kv_pair(k, v);
  check_heads(q, k, paged ? 3 : 2);
  check_float("out", out, 3);
  check_same("out", out, "q", q);
  FLASH_REQUIRE(out.size(0) == q.size(0) && out.size(1) == q.size(1) && out.size(2) == q.size(2),
                "out must have the shape of q ", shape(q), ", got ", shape(out));
  FLASH_REQUIRE(cu_seqlens_q.ndim == 1 && cu_seqlens_q.size(0) >= 1,
                "cu_seqlens_q must be 1-D [batch_size + 1], got shape ", shape(cu_seqlens_q));
  const int b = int(cu_seqlens_q.size(0) - 1);
  const int* cu_q = int_vector("cu_seqlens_q", cu_seqlens_q, b + 1);
  FLASH_REQUIRE(max_seqlen_q >= 0 && max_seqlen_k >= 0, "max_seqlen_q and max_seqlen_k must be >= 0, got ",
                max_seqlen_q, " and ", max_seqlen_k);
  FLASH_REQUIRE(paged || cu_seqlens_k.has_value(), "cu_seqlens_k is required without a block_table");
  FLASH_REQUIRE(!paged || seqused_k.has_value(), "seqused_k is required with a block_table (keys per sequence)");
  const int* cu_k = cu_seqlens_k ? int_vector("cu_seqlens_k", *cu_seqlens_k, b + 1) : nullptr;
  const int* used_k = seqused_k ? int_vector("seqused_k", *seqused_k, b) : nullptr;

  int actual_q = max_seqlen_q, actual_k = max_seqlen_k;  // device lengths: the kernel checks them
  std::vector<int> seqlens_k(b);
  if (cuda) {
    // what the host can check without reading device memory: b sequences of at most max_seqlen_q
    // queries cannot hold more than b * max_seqlen_q rows. No sequence has more rows than q, so the
    // grid covers min(max_seqlen_q, total_q) rows per sequence; the kernel asserts the rest.
    FLASH_REQUIRE(int64_t(b) * max_seqlen_q >= q.size(0), "max_seqlen_q = ", max_seqlen_q, " is too small: q has ",
                  q.size(0), " rows over ", b, " sequences");
    actual_q = int(std::min<int64_t>(max_seqlen_q, q.size(0)));
  } else {
    FLASH_REQUIRE(cu_q[0] == 0, "cu_seqlens_q[0] must be 0, got ", cu_q[0]);
    FLASH_REQUIRE(cu_q[b] == q.size(0), "cu_seqlens_q[-1] must be total_q = ", q.size(0), ", got ", cu_q[b]);
    actual_q = actual_k = 0;
    for (int i = 0; i < b; ++i) {
      const int n = cu_q[i + 1] - cu_q[i];
      FLASH_REQUIRE(n >= 0, "cu_seqlens_q must be non-decreasing, got ", cu_q[i], " then ", cu_q[i + 1]);
      FLASH_REQUIRE(n <= max_seqlen_q, "max_seqlen_q = ", max_seqlen_q, " but sequence ", i, " has ", n, " queries");
      actual_q = std::max(actual_q, n);
      if (cu_k) {
        const int nk = cu_k[i + 1] - cu_k[i];
        FLASH_REQUIRE(nk >= 0, "cu_seqlens_k must be non-decreasing, got ", cu_k[i], " then ", cu_k[i + 1]);
        seqlens_k[i] = nk;
      }
      if (used_k) {
        FLASH_REQUIRE(used_k[i] >= 0, "seqused_k[", i, "] must be >= 0, got ", used_k[i]);
        FLASH_REQUIRE(paged || !cu_k || used_k[i] <= seqlens_k[i], "seqused_k[", i, "] = ", used_k[i],
                      " exceeds the sequence's ", seqlens_k[i], " keys in cu_seqlens_k");
        seqlens_k[i] = used_k[i];
      }
      FLASH_REQUIRE(seqlens_k[i] <= max_seqlen_k, "max_seqlen_k = ", max_seqlen_k, " but sequence ", i, " has ",
                    seqlens_k[i], " keys");
      actual_k = std::max(actual_k, seqlens_k[i]);
    }
  }
  if (cu_k && !paged && !cuda) {
    FLASH_REQUIRE(cu_k[0] == 0 && cu_k[b] <= k.size(0), "cu_seqlens_k must start at 0 and end within k's ", k.size(0),
                  " rows, got ", cu_k[0], " .. ", cu_k[b]);
  }

  Flash_fwd_params params;
  set_qkv_strides(params, q, k, v, out, false);
  set_params_fprop(params, q, k, b, actual_q, max_seqlen_k, softmax_scale, is_causal && max_seqlen_q > 1,
                   window_size_left, window_size_right, softcap);
  // CUDA: max_seqlen_k as given, the bound the kernel checks every sequence's keys against (a device-side
  // assert, as the CPU's check above), so max_seqlen_k = 0 with a non-empty sequence is refused there too
  params.seqlen_k = cuda ? actual_k : std::max(actual_k, 1);
  params.total_q = int(q.size(0));
  params.cu_seqlens_q = const_cast<int*>(cu_q);
  params.cu_seqlens_k = const_cast<int*>(cu_k);
  params.is_seqlens_k_cumulative = true;
  params.seqused_k = const_cast<int*>(used_k);
  params.total_k = paged ? 0 : int(k.size(0));
  if (paged) {
    params.page_block_size = int(k.size(1));
    params.num_blocks = int(k.size(0));
    FLASH_REQUIRE(params.page_block_size > 0, "k block size (dim 1 of the paged cache) must be positive, got ",
                  params.page_block_size);
    check_block_table(*block_table, b, seqlens_k.data(), params.page_block_size, params.num_blocks);
    params.block_table = static_cast<int*>(block_table->data);
    params.block_table_batch_stride = block_table->stride(0);
    params.max_num_blocks_per_seq = int(block_table->size(1));
  }
  if (b == 0 || q.size(0) == 0 || params.h == 0) return;  // nothing to compute (no query head: h / h_k = 0)
  run(params, num_splits, 64, cuda, stream);
}

void mha_fwd_kvcache(const TensorView& q, const TensorView& kcache, const TensorView& vcache,
                     const std::optional<TensorView>& seqlens_k, const std::optional<TensorView>& block_table,
                     const TensorView& out, float softmax_scale, bool is_causal, int window_size_left,
                     int window_size_right, float softcap, int num_splits, void* stream) {
  t_last_stats = SplitKvStats{};
  const bool paged = block_table.has_value();
  const bool cuda = q.is_cuda;
  check_device("k_cache", kcache, q);
  check_device("v_cache", vcache, q);
  check_device("out", out, q);
  check_device("cache_seqlens", seqlens_k, q);
  check_device("block_table", block_table, q);
  check_float("q", q, 4);
  check_float("k_cache", kcache, 4);
  check_float("v_cache", vcache, 4);
  check_same("k_cache", kcache, "q", q);
  check_same("v_cache", vcache, "q", q);
  FLASH_REQUIRE(vcache.ndim == kcache.ndim && vcache.size(0) == kcache.size(0) && vcache.size(1) == kcache.size(1) &&
                    vcache.size(2) == kcache.size(2) && vcache.size(3) == kcache.size(3),
                "v_cache must have the shape of k_cache ", shape(kcache), ", got ", shape(vcache));
  check_heads(q, kcache, 3);
  check_float("out", out, 4);
  check_same("out", out, "q", q);
  for (int i = 0; i < 4; ++i)
    FLASH_REQUIRE(out.size(i) == q.size(i), "out must have the shape of q ", shape(q), ", got ", shape(out));
  const int b = int(q.size(0));
  const int seqlen_q = int(q.size(1));
  int capacity;
  if (paged) {
    FLASH_REQUIRE(kcache.size(1) > 0, "k_cache block size (dim 1) must be positive, got ", kcache.size(1));
    FLASH_REQUIRE(block_table->ndim == 2, "block_table must be 2-D [batch_size, max_blocks], got shape ",
                  shape(*block_table));
    FLASH_REQUIRE(block_table->size(1) * kcache.size(1) <= std::numeric_limits<int>::max(),
                  "block_table holds more keys per sequence (", block_table->size(1), " blocks of ", kcache.size(1),
                  ") than a 32-bit int counts");
    capacity = int(block_table->size(1) * kcache.size(1));
  } else {
    FLASH_REQUIRE(kcache.size(0) == b, "k_cache must be [batch_size=", b,
                  ", seqlen_k, h_k, d] without a block_table, got ", shape(kcache));
    capacity = int(kcache.size(1));
  }
  std::vector<int> lens(b, capacity);
  const int* lens_ptr = nullptr;
  if (seqlens_k) {
    lens_ptr = int_vector("cache_seqlens", *seqlens_k, b);
    for (int i = 0; i < b && !cuda; ++i) {
      FLASH_REQUIRE(lens_ptr[i] >= 0 && lens_ptr[i] <= capacity, "cache_seqlens[", i, "] = ", lens_ptr[i],
                    " must be in [0, ", capacity, "] (the keys the cache holds for a sequence)");
      lens[i] = lens_ptr[i];
    }
  }

  Flash_fwd_params params;
  set_qkv_strides(params, q, kcache, vcache, out, true);
  set_params_fprop(params, q, kcache, b, seqlen_q, capacity, softmax_scale, is_causal && seqlen_q > 1, window_size_left,
                   window_size_right, softcap);
  params.total_q = b * seqlen_q;
  params.cu_seqlens_k = const_cast<int*>(lens_ptr);  // per-sequence lengths, as upstream
  params.is_seqlens_k_cumulative = false;
  params.seqlen_k = cuda ? capacity : b ? std::max(1, *std::max_element(lens.begin(), lens.end())) : 1;
  if (paged) {
    params.page_block_size = int(kcache.size(1));
    params.num_blocks = int(kcache.size(0));
    check_block_table(*block_table, b, lens.data(), params.page_block_size, params.num_blocks);
    params.block_table = static_cast<int*>(block_table->data);
    params.block_table_batch_stride = block_table->stride(0);
    params.max_num_blocks_per_seq = int(block_table->size(1));
  }
  if (b == 0 || seqlen_q == 0 || params.h == 0) return;
  run(params, num_splits, 64, cuda, stream);
}

}  // namespace flash
