"""The one attention seam of the engine: write a step's new K/V into the paged cache, then attend every
new query to its sequence's whole context (cached prefix + new tokens) through the block tables.

The runner builds one `AttnMetadata` per step (varlen layout, flash-attention's argument names); every
layer calls `paged_attention`. This implementation gathers each sequence's blocks into a padded dense
tensor and runs one SDPA call for the whole batch (no per-sequence loop)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from keel import ops


@dataclass(slots=True)
class AttnMetadata:
    """Per-step attention metadata, shared by every layer. Sequence b's new queries are rows
    cu_seqlens_q[b]:cu_seqlens_q[b+1]; they sit at the end of its seqused_k[b] context tokens."""

    slot_mapping: torch.Tensor  # [T] int64: flat cache slot of each new token
    cu_seqlens_q: torch.Tensor  # [B+1] int32
    seqused_k: torch.Tensor  # [B] int32: context length (cached + new) of each sequence
    cu_seqlens_k: torch.Tensor  # [B+1] int32: prefix sums of seqused_k
    block_tables: torch.Tensor  # [B, max_blocks] int32 (padding rows point at block 0, never read)
    max_seqlen_q: int
    max_seqlen_k: int
    _memo: dict = field(default_factory=dict)  # derived tensors of the gather path, built once per step

    @property
    def num_seqs(self) -> int:
        return self.seqused_k.shape[0]

    @property
    def is_decode(self) -> bool:
        """Every sequence computes exactly one token."""
        return self.max_seqlen_q == 1


def _key_mask(md: AttnMetadata, block_size: int, window: int | None) -> torch.Tensor:
    """[B, Lq, Lk] bool: query i of sequence b (absolute position ctx_len - q_len + i) may see key j.
    Padding query rows see key 0 only, so no row is fully masked (their output is dropped)."""
    key = ("mask", window)
    if key not in md._memo:
        dev = md.seqused_k.device
        lens_k = md.seqused_k.long()[:, None, None]  # [B, 1, 1]
        lens_q = (md.cu_seqlens_q[1:] - md.cu_seqlens_q[:-1]).long()[:, None, None]
        kpos = torch.arange(md.block_tables.shape[1] * block_size, device=dev)[None, None, :]  # [1, 1, Lk]
        qi = torch.arange(md.max_seqlen_q, device=dev)[None, :, None]  # [1, Lq, 1]
        qpos = lens_k - lens_q + qi
        mask = kpos <= qpos
        if window is not None:
            mask &= kpos > qpos - window
        md._memo[key] = mask | ((qi >= lens_q) & (kpos == 0))
    return md._memo[key]


def _bias(md: AttnMetadata, block_size: int, window: int | None, dtype: torch.dtype) -> torch.Tensor:
    """The mask as an additive SDPA bias [B, 1, Lq, Lk] (0 or -inf)."""
    key = ("bias", window, dtype)
    if key not in md._memo:
        mask = _key_mask(md, block_size, window)
        bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
        md._memo[key] = bias[:, None]
    return md._memo[key]


def _query_rows(md: AttnMetadata) -> torch.Tensor:
    """[T] int64: row of each packed query in the padded [B * Lq] layout."""
    if "rows" not in md._memo:
        lens_q = md.cu_seqlens_q[1:] - md.cu_seqlens_q[:-1]
        valid = torch.arange(md.max_seqlen_q, device=lens_q.device)[None, :] < lens_q[:, None]  # [B, Lq]
        md._memo["rows"] = valid.view(-1).nonzero().view(-1)
    return md._memo["rows"]


def gather_sdpa(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    md: AttnMetadata,
    scale: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """softmax(q K^T) V over each sequence's paged context; q [T, H, D] -> [T, H, D]."""
    b, lq = md.num_seqs, md.max_seqlen_q
    t, h, d = q.shape
    bs, kvh = k_cache.shape[1], k_cache.shape[2]
    blocks = md.block_tables.view(-1).long()  # index_select: ~7x faster than advanced indexing on CPU
    k = k_cache.index_select(0, blocks).view(b, -1, kvh, d).transpose(1, 2)  # [B, KV, Lk, D]
    v = v_cache.index_select(0, blocks).view(b, -1, kvh, d).transpose(1, 2)
    bias = _bias(md, bs, window, q.dtype)  # [B, 1, Lq, Lk]
    if md.is_decode:
        # The G = H / KV query heads sharing a kv head act as G queries of one position: no GQA
        # expansion (about 2x faster on CPU than enable_gqa).
        qg = q.view(b, kvh, h // kvh, d)  # [B, KV, G, D]
        return F.scaled_dot_product_attention(qg, k, v, attn_mask=bias, scale=scale).view(t, h, d)
    rows = _query_rows(md)
    padded = q.new_zeros(b * lq, h, d)
    padded[rows] = q
    padded = padded.view(b, lq, h, d).transpose(1, 2)  # [B, H, Lq, D]
    o = F.scaled_dot_product_attention(padded, k, v, attn_mask=bias, scale=scale, enable_gqa=True)
    return o.transpose(1, 2).reshape(b * lq, h, d)[rows]


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
    return gather_sdpa(q, k_cache, v_cache, md, scale, window)
