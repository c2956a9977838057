"""Vendored flash-attention-style attention (varlen and paged) in upstream's Python call shape.

`flash_attn_varlen_func` and `flash_attn_with_kvcache` take the arguments of
flash_attn/flash_attn_interface.py (and of vLLM's fork, vllm_flash_attn, for `block_table` +
`seqused_k`). The custom op cannot take the `window_size=(left, right)` tuple, so it is passed as
two ints (`window_left`, `window_right`), as vLLM's fork does. Semantics as upstream: the causal
mask is aligned to the bottom-right corner (query i of a sequence with seqlen_q queries and
seqlen_k keys sees keys j <= i + seqlen_k - seqlen_q), the window is relative to that alignment
(-1: unbounded), softcap > 0 gives scores = softcap * tanh(scores / softcap), a query row that sees
no key returns 0.
"""

from __future__ import annotations

import math

import torch

from keel.vendored.flash_attn import _ops  # noqa: F401  (loads the library, registers the fake kernels)

__all__ = ["flash_attn_varlen_func", "flash_attn_with_kvcache", "cpu_isa", "last_splitkv_stats"]

_ISA_NAMES = {0: "base", 1: "avx2", 2: "avx512"}
_FWD_KVCACHE = torch.ops.keel_flash_attn.fwd_kvcache.default
_VARLEN_FWD = torch.ops.keel_flash_attn.varlen_fwd.default


def _unsupported(func: str, **options: object) -> None:
    """Refuse an upstream option this fork does not implement, naming it."""
    for name, value in options.items():
        if value:
            raise NotImplementedError(f"keel.vendored.flash_attn.{func}: {name}={value!r} is not supported")


def _window(func: str, window_size: tuple[int, int]) -> tuple[int, int]:
    if type(window_size) is tuple and window_size == (-1, -1):
        return -1, -1
    if len(window_size) != 2:
        raise ValueError(f"keel.vendored.flash_attn.{func}: window_size must be (left, right), got {window_size!r}")
    return int(window_size[0]), int(window_size[1])


def _scale(q: torch.Tensor, softmax_scale: float | None) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: torch.Tensor | None = None,
    seqused_k: torch.Tensor | None = None,
    num_splits: int = 0,
) -> torch.Tensor:
    """Attention over packed ragged sequences: q [total_q, H, D], k/v [total_k, H_kv, D] -> [total_q, H, D].

    With `block_table` [B, max_blocks] int32, k/v are paged caches [num_blocks, block_size, H_kv, D]
    and `seqused_k` [B] int32 (required then) gives each sequence's keys; cu_seqlens_k may be None.
    `deterministic` is accepted and moot: the CPU kernels are deterministic. `num_splits`: 0 does
    not split along the keys on the CPU (one summation order whatever the call's shape)."""
    func = "flash_attn_varlen_func"
    _unsupported(func, dropout_p=dropout_p, alibi_slopes=alibi_slopes is not None, return_attn_probs=return_attn_probs)
    if block_table is not None and seqused_k is None:
        raise ValueError(f"keel.vendored.flash_attn.{func}: seqused_k is required with block_table")
    left, right = _window(func, window_size)
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    return _VARLEN_FWD(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        seqused_k,
        block_table,
        int(max_seqlen_q),
        int(max_seqlen_k),
        _scale(q, softmax_scale),
        bool(causal),
        left,
        right,
        float(softcap),
        int(num_splits),
    )


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: torch.Tensor | int | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = True,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: torch.Tensor | None = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
) -> torch.Tensor:
    """Attention of q [B, S_q, H, D] against a KV cache -> [B, S_q, H, D].

    The cache is paged, [num_blocks, block_size, H_kv, D] with `block_table` [B, max_blocks] int32,
    or dense [B, S_k, H_kv, D]; `cache_seqlens` [B] int32 (or one int) gives each sequence's keys.
    Appending k/v in the call, rotary, cache_batch_idx and cache_leftpad are not supported (keel
    writes the cache with keel::reshape_and_cache)."""
    func = "flash_attn_with_kvcache"
    if not (
        k is v is rotary_cos is rotary_sin is cache_batch_idx is cache_leftpad is alibi_slopes is None
        and not return_softmax_lse
    ):  # (one test per decode call: this runs once per layer and token)
        _unsupported(
            func,
            k=k is not None,
            v=v is not None,
            rotary_cos=rotary_cos is not None,
            rotary_sin=rotary_sin is not None,
            cache_batch_idx=cache_batch_idx is not None,
            cache_leftpad=cache_leftpad is not None,
            alibi_slopes=alibi_slopes is not None,
            return_softmax_lse=return_softmax_lse,
        )
    left, right = _window(func, window_size)
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=q.device)
    q = _last_dim_contiguous(q)
    return _FWD_KVCACHE(
        q,
        k_cache,
        v_cache,
        cache_seqlens,
        block_table,
        _scale(q, softmax_scale),
        bool(causal),
        left,
        right,
        float(softcap),
        int(num_splits),
    )


def cpu_isa() -> str:
    """Name of the CPU build the kernels run in this process: base, avx2 or avx512."""
    return _ISA_NAMES[torch.ops.keel_flash_attn.cpu_isa(torch.empty(0))]


def last_splitkv_stats() -> tuple[int, int]:
    """What this thread's last attention call did along the keys, on the CPU kernels: (the splits it
    ran, the fp32 partials the split-K combine merged); (0, 0) when it returned before any kernel ran.
    A split-K run of q [rows, H, D] in n splits reports (n, n * rows * H); an unsplit one (1, 0)."""
    splits, combined = torch.ops.keel_flash_attn.last_splitkv_stats(torch.empty(0))
    return int(splits), int(combined)
