"""keel_flash_attn's ops: loads the vendored attention library and registers its fake kernels.

Importing this module loads `keel/vendored/flash_attn/_C.abi3.so` (schemas in
adapters/flash_attn/bindings.cpp); `import keel` alone never does. The fakes (meta tensors,
torch.compile / FakeTensor tracing) run the checks of the adapter (adapters/flash_attn/flash_attn.cpp)
and of the fork (vendored_deps/flash_attn/src/flash_api.cpp) in the same order and with the same
messages; what they cannot run is what the fork reads from index tensors on the host (sequence
lengths, block ids), as for CUDA tensors.
"""

from __future__ import annotations

import math

import torch

from keel import _oplist
from keel.vendored import _checks as vc
from keel.vendored._loader import load_vendored

NAMESPACE = "keel_flash_attn"
OPS = list(_oplist.ops(NAMESPACE))
LIBRARY = load_vendored("flash_attn", NAMESPACE, OPS)
VARLEN = f"{NAMESPACE}::varlen_fwd"
KVCACHE = f"{NAMESPACE}::fwd_kvcache"

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_FORK_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16", torch.int32: "int32"}


def _fork_name(t: torch.Tensor) -> str:
    """The fork's DType name (src/tensor_view.h dtype_name)."""
    return _FORK_NAMES.get(t.dtype, "an unsupported dtype")


def _view(op: str, arg: str, t: object, ref: torch.Tensor | None, index: bool = False) -> torch.Tensor:
    """The adapter's view(): device, 1 to 4 dims, int32 for index tensors, a dtype the fork knows."""
    t = vc.library_device(op, arg, t, ref)
    if not 1 <= t.dim() <= 4:
        vc.fail(f"{op}: {arg} must have 1 to 4 dimensions, got {t.dim()}-D tensor of shape {vc.shape(t)}")
    if index and t.dtype != torch.int32:
        vc.fail(f"{op}: {arg} must be int32, got {vc.stable_dtype_name(t.dtype)}")
    if t.dtype not in _FORK_NAMES:
        vc.fail(f"{op}: {arg} must be float32, bfloat16 or float16, got {vc.stable_dtype_name(t.dtype)}")
    return t


def _views(
    op: str, tensors: dict[str, object], index: tuple[str, ...], optional: tuple[str, ...]
) -> dict[str, torch.Tensor | None]:
    """_view of each argument in order; an `optional` one may be None."""
    first = next(iter(tensors.values()))
    ref = first if isinstance(first, torch.Tensor) else None
    return {
        name: None if t is None and name in optional else _view(op, name, t, ref, name in index)
        for name, t in tensors.items()
    }


def _float(op: str, name: str, t: torch.Tensor, ndim: int) -> None:
    """The fork's check_float: a float dtype, `ndim` dims, a contiguous last dim."""
    if t.dtype not in _FLOATS:
        vc.fail(f"{op}: {name} must be float32, bfloat16 or float16, got {_fork_name(t)}")
    if t.dim() != ndim:
        vc.fail(f"{op}: {name} must be {ndim}-D, got shape {vc.shape(t)}")
    if not (t.stride(-1) == 1 or t.shape[-1] == 1):
        vc.fail(f"{op}: {name} must have a contiguous last dimension, got strides with stride(-1) = {t.stride(-1)}")


def _same(op: str, name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    if t.dtype != ref.dtype:
        vc.fail(f"{op}: {name} must have the dtype of {ref_name} ({_fork_name(ref)}), got {_fork_name(t)}")


def _int_vector(op: str, name: str, t: torch.Tensor, n: int) -> None:
    """The fork's int_vector, less reading the values."""
    if t.dtype != torch.int32:
        vc.fail(f"{op}: {name} must be int32, got {_fork_name(t)}")
    if not (t.dim() == 1 and t.shape[0] == n):
        vc.fail(f"{op}: {name} must be 1-D with {n} elements, got shape {vc.shape(t)}")
    if not (n <= 1 or t.stride(0) == 1):
        vc.fail(f"{op}: {name} must be contiguous")


def _heads(op: str, q: torch.Tensor, k: torch.Tensor, head_dim_index: int) -> None:
    h, h_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    if not (h_k > 0 and h % h_k == 0):
        vc.fail(f"{op}: number of heads in q ({h}) must be a multiple of the kv heads ({h_k})")
    if h // h_k > 256:
        vc.fail(f"{op}: at most 256 query heads per kv head are supported, got {h // h_k}")
    if not (d > 0 and d % 8 == 0 and d <= 256):
        vc.fail(f"{op}: head_size must be a positive multiple of 8 up to 256, got {d}")
    if k.shape[head_dim_index] != d:
        vc.fail(f"{op}: k must have head_size {d}, got shape {vc.shape(k)}")


def _scale_and_softcap(op: str, softmax_scale: float, softcap: float) -> None:
    """set_params_fprop's checks, on the values narrowed to float."""
    if not math.isfinite(softmax_scale):
        vc.fail(f"{op}: softmax_scale must be finite, got {vc.cpp_number(softmax_scale)}")
    if not (math.isfinite(softcap) and softcap >= 0.0):
        vc.fail(f"{op}: softcap must be finite and >= 0, got {vc.cpp_number(softcap)}")


def _block_table_rows(op: str, bt: torch.Tensor, b: int) -> None:
    """check_block_table, less reading the block ids."""
    if not (bt.dim() == 2 and bt.shape[0] == b):
        vc.fail(f"{op}: block_table must be [batch_size={b}, max_blocks], got shape {vc.shape(bt)}")
    if not (bt.shape[1] <= 1 or bt.stride(1) == 1):
        vc.fail(f"{op}: block_table must have a contiguous last dimension")


def _num_splits(op: str, num_splits: int) -> None:
    if not 0 <= num_splits <= 128:
        vc.fail(f"{op}: num_splits must be in [0, 128], got {num_splits}")


def _narrow(
    op: str, window_left: int, window_right: int, softmax_scale: float, softcap: float, num_splits: int
) -> tuple[float, float]:
    """The adapter's narrow(): the fork's int / float options, range-checked."""
    vc.to_int(op, "window_left", window_left)
    vc.to_int(op, "window_right", window_right)
    scale = vc.to_float(op, "softmax_scale", softmax_scale)
    cap = vc.to_float(op, "softcap", softcap)
    vc.to_int(op, "num_splits", num_splits)
    return scale, cap


# varlen mode: the output is packed like q, [total_q, H, D]
@torch.library.register_fake(VARLEN)
def _varlen_fwd_fake(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    seqused_k,
    block_table,
    max_seqlen_q,
    max_seqlen_k,
    softmax_scale,
    causal,
    window_left,
    window_right,
    softcap,
    num_splits,
):
    op = VARLEN
    args = dict(
        q=q,
        k=k,
        v=v,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        seqused_k=seqused_k,
        block_table=block_table,
    )
    optional = ("cu_seqlens_k", "seqused_k", "block_table")
    t = _views(op, args, index=("cu_seqlens_q", *optional), optional=optional)
    vc.to_int(op, "max_seqlen_q", max_seqlen_q)
    vc.to_int(op, "max_seqlen_k", max_seqlen_k)
    scale, cap = _narrow(op, window_left, window_right, softmax_scale, softcap, num_splits)
    q, k, v, cu_q = t["q"], t["k"], t["v"], t["cu_seqlens_q"]
    assert q is not None and k is not None and v is not None and cu_q is not None
    paged = t["block_table"] is not None
    _float(op, "q", q, 3)
    _float(op, "k", k, 4 if paged else 3)
    _float(op, "v", v, 4 if paged else 3)
    _same(op, "k", k, "q", q)
    _same(op, "v", v, "q", q)
    if k.shape != v.shape:
        vc.fail(f"{op}: v must have the shape of k {vc.shape(k)}, got {vc.shape(v)}")
    _heads(op, q, k, 3 if paged else 2)
    if not (cu_q.dim() == 1 and cu_q.shape[0] >= 1):
        vc.fail(f"{op}: cu_seqlens_q must be 1-D [batch_size + 1], got shape {vc.shape(cu_q)}")
    b = cu_q.shape[0] - 1
    _int_vector(op, "cu_seqlens_q", cu_q, b + 1)
    if not (max_seqlen_q >= 0 and max_seqlen_k >= 0):
        vc.fail(f"{op}: max_seqlen_q and max_seqlen_k must be >= 0, got {max_seqlen_q} and {max_seqlen_k}")
    if not paged and t["cu_seqlens_k"] is None:
        vc.fail(f"{op}: cu_seqlens_k is required without a block_table")
    if paged and t["seqused_k"] is None:
        vc.fail(f"{op}: seqused_k is required with a block_table (keys per sequence)")
    if (cu_k := t["cu_seqlens_k"]) is not None:
        _int_vector(op, "cu_seqlens_k", cu_k, b + 1)
    if (used := t["seqused_k"]) is not None:
        _int_vector(op, "seqused_k", used, b)
    _scale_and_softcap(op, scale, cap)
    if (bt := t["block_table"]) is not None:
        if k.shape[1] <= 0:
            vc.fail(f"{op}: k block size (dim 1 of the paged cache) must be positive, got {k.shape[1]}")
        _block_table_rows(op, bt, b)
    if b != 0 and q.shape[0] != 0 and q.shape[1] != 0:  # the kernel returns early without rows or heads
        _num_splits(op, num_splits)
    return q.new_empty(q.shape)


# batch mode: the output is [B, S_q, H, D] like q
@torch.library.register_fake(KVCACHE)
def _fwd_kvcache_fake(
    q,
    k_cache,
    v_cache,
    cache_seqlens,
    block_table,
    softmax_scale,
    causal,
    window_left,
    window_right,
    softcap,
    num_splits,
):
    op = KVCACHE
    args = dict(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens, block_table=block_table)
    t = _views(op, args, index=("cache_seqlens", "block_table"), optional=("cache_seqlens", "block_table"))
    scale, cap = _narrow(op, window_left, window_right, softmax_scale, softcap, num_splits)
    q, kc, vc_ = t["q"], t["k_cache"], t["v_cache"]
    assert q is not None and kc is not None and vc_ is not None
    _float(op, "q", q, 4)
    _float(op, "k_cache", kc, 4)
    _float(op, "v_cache", vc_, 4)
    _same(op, "k_cache", kc, "q", q)
    _same(op, "v_cache", vc_, "q", q)
    if kc.shape != vc_.shape:
        vc.fail(f"{op}: v_cache must have the shape of k_cache {vc.shape(kc)}, got {vc.shape(vc_)}")
    _heads(op, q, kc, 3)
    b, seqlen_q = q.shape[0], q.shape[1]
    bt = t["block_table"]
    if bt is not None:
        if kc.shape[1] <= 0:
            vc.fail(f"{op}: k_cache block size (dim 1) must be positive, got {kc.shape[1]}")
        if bt.dim() != 2:
            vc.fail(f"{op}: block_table must be 2-D [batch_size, max_blocks], got shape {vc.shape(bt)}")
        if bt.shape[1] * kc.shape[1] > vc.INT32_MAX:
            vc.fail(
                f"{op}: block_table holds more keys per sequence ({bt.shape[1]} blocks of {kc.shape[1]}) "
                "than a 32-bit int counts"
            )
    elif kc.shape[0] != b:
        vc.fail(f"{op}: k_cache must be [batch_size={b}, seqlen_k, h_k, d] without a block_table, got {vc.shape(kc)}")
    if (lens := t["cache_seqlens"]) is not None:
        _int_vector(op, "cache_seqlens", lens, b)
    _scale_and_softcap(op, scale, cap)
    if bt is not None:
        _block_table_rows(op, bt, b)
    if b != 0 and seqlen_q != 0 and q.shape[2] != 0:
        _num_splits(op, num_splits)
    return q.new_empty(q.shape)


# The CPU build is a property of the process, fixed at load (KEEL_CPU_ISA is read once): the real answer.
_CPU_ISA = int(torch.ops.keel_flash_attn.cpu_isa(torch.empty(0)))


@torch.library.register_fake(f"{NAMESPACE}::cpu_isa")
def _cpu_isa_fake(probe):
    return _CPU_ISA


# A fake runs no kernel, so there is no split to report: (0, 0), as after a call that ran none.
@torch.library.register_fake(f"{NAMESPACE}::last_splitkv_stats")
def _last_splitkv_stats_fake(probe):
    return 0, 0
