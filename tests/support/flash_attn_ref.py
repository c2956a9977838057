"""fp64 reference of softmax(QK^T)V with upstream flash-attention's mask semantics, and paged-cache builders.

The mask is aligned to the bottom-right corner: query i of a sequence with sq queries and sk keys
sees key j when j <= i + sk - sq + right and j >= i + sk - sq - left (-1: no bound; causal means
right = 0). A query that sees no key gives 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    scale: float | None = None,
) -> torch.Tensor:
    """One sequence: q [sq, H, D], k/v [sk, H_kv, D] -> fp64 [sq, H, D]."""
    sq, h, d = q.shape
    sk, hk = k.shape[0], k.shape[1]
    scale = d**-0.5 if scale is None else scale
    kk = k.double().repeat_interleave(h // hk, dim=1)
    vv = v.double().repeat_interleave(h // hk, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.double(), kk) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    left, right = window
    if causal:
        right = 0
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    visible = torch.ones(sq, sk, dtype=torch.bool)
    if right >= 0:
        visible &= j <= i + sk - sq + right
    if left >= 0:
        visible &= j >= i + sk - sq - left
    s = s.masked_fill(~visible, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # all-masked rows: 0
    return torch.einsum("hqk,khd->qhd", p, vv)


def varlen_ref(q, k, v, lens_q: list[int], lens_k: list[int], **kw) -> torch.Tensor:
    """Packed q [total_q, H, D], k/v [total_k, H_kv, D] -> fp64 [total_q, H, D]."""
    out, oq, ok = [], 0, 0
    for sq, sk in zip(lens_q, lens_k, strict=True):
        out.append(attention_ref(q[oq : oq + sq], k[ok : ok + sk], v[ok : ok + sk], **kw))
        oq, ok = oq + sq, ok + sk
    return torch.cat(out) if out else torch.zeros(0, *q.shape[1:], dtype=torch.float64)


def cu(lens: list[int]) -> torch.Tensor:
    """Cumulative lengths [B + 1] int32, as upstream takes them."""
    return torch.tensor([0, *torch.tensor(lens, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32)


@dataclass
class Paged:
    """Paged K/V caches built from packed rows, block table shuffled (blocks in random order)."""

    k_cache: torch.Tensor  # [num_blocks, block_size, H_kv, D]
    v_cache: torch.Tensor
    block_table: torch.Tensor  # [B, max_blocks] int32
    seqlens: torch.Tensor  # [B] int32


def paged(
    k: torch.Tensor, v: torch.Tensor, lens_k: list[int], block_size: int, gen: torch.Generator, spare_blocks: int = 3
) -> Paged:
    need = [(n + block_size - 1) // block_size for n in lens_k]
    max_blocks = max([*need, 1])
    num_blocks = sum(need) + spare_blocks
    order = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    kc = torch.randn(num_blocks, block_size, *k.shape[1:], generator=gen).to(k.dtype)  # garbage in unused slots
    vc = torch.randn(num_blocks, block_size, *v.shape[1:], generator=gen).to(v.dtype)
    table = torch.full((len(lens_k), max_blocks), num_blocks + 100, dtype=torch.int32)  # unused: out of range
    used, off = 0, 0
    for b, n in enumerate(lens_k):
        for i in range(need[b]):
            blk = int(order[used])
            used += 1
            table[b, i] = blk
            rows = slice(off + i * block_size, off + min(n, (i + 1) * block_size))
            cnt = rows.stop - rows.start
            kc[blk, :cnt] = k[rows]
            vc[blk, :cnt] = v[rows]
        off += n
    return Paged(kc, vc, table, torch.tensor(lens_k, dtype=torch.int32))


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """Explicit tolerances: fp32 accumulation everywhere; the output is rounded to the input dtype."""
    return {
        torch.float32: {"atol": 1e-4, "rtol": 1e-4},
        torch.bfloat16: {"atol": 1.5e-2, "rtol": 1.5e-2},
        torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    }[dtype]
