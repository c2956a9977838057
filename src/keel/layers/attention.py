"""The one attention seam of keel's models: every new query attends to its sequence's whole context (cached prefix +
new tokens) through the block tables of the paged K/V cache.

The engine's model runner builds one `AttnMetadata` per step (varlen layout, flash-attention's argument
names) and binds each layer's K/V pools into its `PagedAttention`. A layer writes its step's new K/V into the pools
(keel.ops.layer_qkv, or `paged_attention` for a caller with separate q/k/v), then `attend_cached` hands the block
tables to keel's vendored flash-attention kernels (`keel.vendored.flash_attn`): no gather copy, no dense mask, GQA
and sliding windows in the kernel. Block sizes that are not a multiple of 16 (the tests' tiny 4-token blocks) are
beyond the paged kernels; for those the context rows are gathered into packed K/V for the same varlen kernel."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from keel import _compat, ops
from keel.vendored.flash_attn import flash_attn_varlen_func


@dataclass(slots=True)
class AttnMetadata:
    """Per-step attention metadata, shared by every layer (the step's context object: layers take plain
    tensors plus this). Sequence b's new queries are rows
    cu_seqlens_q[b]:cu_seqlens_q[b+1]; they sit at the end of its seqused_k[b] context tokens."""

    slot_mapping: torch.Tensor  # [T] int64: flat cache slot of each new token
    cu_seqlens_q: torch.Tensor  # [B+1] int32
    seqused_k: torch.Tensor  # [B] int32: context length (cached + new) of each sequence
    cu_seqlens_k: torch.Tensor  # [B+1] int32: prefix sums of seqused_k
    block_tables: torch.Tensor  # [B, max_blocks] int32 (padding rows point at block 0, never read)
    max_seqlen_q: int
    max_seqlen_k: int
    # Only for block sizes the paged kernels do not take (not a multiple of PAGE_MULTIPLE): the flat cache
    # slot of every context token, sequence after sequence [sum(seqused_k)] int64.
    context_slots: torch.Tensor | None = None

    @property
    def num_seqs(self) -> int:
        return self.seqused_k.shape[0]

    @property
    def is_decode(self) -> bool:
        """Every sequence computes exactly one token."""
        return self.max_seqlen_q == 1


PAGE_MULTIPLE = 16  # the vendored paged kernels read keys in tiles of 16 rows of one block


def _window_size(window: int | None) -> tuple[int, int]:
    """A model's sliding window (a query sees the `window` most recent keys, itself included) as
    flash-attention's (left, right): left = window - 1 keys before the query, none after."""
    return (-1, -1) if window is None else (window - 1, 0)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    md: AttnMetadata,
    scale: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Store the new k/v [T, KV, D] in the caches [num_blocks, block_size, KV, D], then attend q [T, H, D]
    causally (and within `window` tokens, if set) to each sequence's context; returns [T, H, D]."""
    ops.reshape_and_cache(k, v, k_cache, v_cache, md.slot_mapping)
    return attend_cached(q, k_cache, v_cache, md, scale, window)


_fwd_kvcache = _compat.op_entry(torch.ops.keel_flash_attn.fwd_kvcache.default)


def attend_cached(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    md: AttnMetadata,
    scale: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Attend q [T, H, D] to each sequence's context, already in the caches (the step's own k/v included);
    returns [T, H, D]. A decode step (one query per sequence) reads the cache through the kv-cache kernel, called
    straight through its C++ entry; any other step is one `flash_attn_varlen_func` call over the whole batch."""
    window_size = _window_size(window)
    if md.max_seqlen_q == 1 and md.context_slots is None:  # (small test blocks take the gathered varlen path below)
        b, h, d = q.shape
        s = 1.0 / math.sqrt(d) if scale is None else float(scale)  # (flash_attn's default scale)
        out = _fwd_kvcache(q.view(b, 1, h, d), k_cache, v_cache, md.seqused_k, md.block_tables, s, True, *window_size,
                           0.0, 0)  # fmt: skip
        return out.view(b, h, d)
    if md.context_slots is not None:  # small test blocks: the same kernel over packed (gathered) K/V rows
        kvh, d = k_cache.shape[2:]
        k_src, v_src = (c.view(-1, kvh, d).index_select(0, md.context_slots) for c in (k_cache, v_cache))
        block_table = seqused_k = None
    else:
        k_src, v_src, block_table, seqused_k = k_cache, v_cache, md.block_tables, md.seqused_k
    return flash_attn_varlen_func(
        q,
        k_src,
        v_src,
        md.cu_seqlens_q,
        md.cu_seqlens_k,
        md.max_seqlen_q,
        md.max_seqlen_k,
        softmax_scale=scale,
        causal=True,
        window_size=window_size,
        block_table=block_table,
        seqused_k=seqused_k,
    )


class PagedAttention(nn.Module):
    """A layer's attention over its paged K/V pools [num_blocks, block_size, kv_heads, head_dim].

    The pools are plain attributes, empty until the model runner binds the tensors it owns (and grows); the layer
    writes its new keys and values into them first (keel.ops.layer_qkv), then calls this."""

    def __init__(self, scale: float | None = None, window: int | None = None) -> None:
        super().__init__()
        self.scale, self.window = scale, window
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)

    def forward(self, q: torch.Tensor, md: AttnMetadata) -> torch.Tensor:
        """q [T, H, D] -> [T, H, D]."""
        return attend_cached(q, self.k_cache, self.v_cache, md, self.scale, self.window)
