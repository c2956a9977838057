"""The attention seam (src/keel/layers/attention.py) against a float64 softmax(QK^T)V per sequence: ragged
batches with cached prefixes, decode steps, GQA, sliding windows, shuffled block tables, contexts crossing
block edges."""

from __future__ import annotations

import itertools

import pytest
import torch
from support.native import needs_ops

from keel.layers.attention import PAGE_MULTIPLE, AttnMetadata, paged_attention

pytestmark = needs_ops


def reference(q, k, v, window):
    """q [Lq, H, D] at the end of k/v [Lk, KV, D]; causal, within `window` if set; float64."""
    lq, h, _ = q.shape
    lk, kvh, _ = k.shape
    k, v = (t.double().repeat_interleave(h // kvh, dim=1) for t in (k, v))
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) / q.shape[-1] ** 0.5
    qpos = torch.arange(lk - lq, lk)[:, None]
    kpos = torch.arange(lk)[None, :]
    allowed = kpos <= qpos
    if window is not None:
        allowed &= kpos > qpos - window
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def run_case(ctx_lens, new_lens, heads, kv_heads, window, block_size, head_dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-n // block_size) for n in ctx_lens) + 3
    order = torch.randperm(num_blocks, generator=g).tolist()  # shuffled tables
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)  # garbage everywhere
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    tables, qs, ks, vs, full, slots, cu = [], [], [], [], [], [], [0]
    for n, m in zip(ctx_lens, new_lens, strict=True):
        table = [order.pop() for _ in range(-(-n // block_size))]
        k = torch.randn(n, kv_heads, head_dim, generator=g)
        v = torch.randn(n, kv_heads, head_dim, generator=g)
        for p in range(n - m):  # the cached prefix is already in the cache
            k_cache[table[p // block_size], p % block_size] = k[p]
            v_cache[table[p // block_size], p % block_size] = v[p]
        slots += [table[p // block_size] * block_size + p % block_size for p in range(n - m, n)]
        q = torch.randn(m, heads, head_dim, generator=g)
        tables.append(table)
        qs.append(q)
        ks.append(k[n - m :])
        vs.append(v[n - m :])
        full.append((q, k, v))
        cu.append(cu[-1] + m)
    width = max(map(len, tables))
    md = AttnMetadata(
        slot_mapping=torch.tensor(slots),
        cu_seqlens_q=torch.tensor(cu, dtype=torch.int32),
        seqused_k=torch.tensor(ctx_lens, dtype=torch.int32),
        cu_seqlens_k=torch.tensor([0, *itertools.accumulate(ctx_lens)], dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        max_seqlen_q=max(new_lens),
        max_seqlen_k=max(ctx_lens),
    )
    if block_size % PAGE_MULTIPLE:
        md.context_slots = torch.tensor(
            [
                t[p // block_size] * block_size + p % block_size
                for t, n in zip(tables, ctx_lens, strict=True)
                for p in range(n)
            ]
        )
    out = paged_attention(torch.cat(qs), torch.cat(ks), torch.cat(vs), k_cache, v_cache, md, window=window)
    ref = torch.cat([reference(q, k, v, window) for q, k, v in full])
    assert out.shape == ref.shape
    assert (out.double() - ref).abs().max().item() < 1e-5


@pytest.mark.parametrize("block_size", [16, 32, 4])  # 4: the packed fallback for blocks the kernels do not page
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (6, 2), (8, 1)])
def test_mixed_prefill_with_cached_prefix(heads, kv_heads, window, block_size):
    # a fresh prompt, a prompt with 45 cached tokens, a decode step, a one-token prompt, a block-edge prompt
    run_case([37, 50, 33, 1, 16], [37, 5, 1, 1, 16], heads, kv_heads, window, block_size)


@pytest.mark.parametrize("block_size", [16, 4])
@pytest.mark.parametrize("window", [None, 2])
def test_decode_batch(window, block_size):
    run_case([1, 5, 17, 32, 33], [1] * 5, 6, 3, window, block_size)
