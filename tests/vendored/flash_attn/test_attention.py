"""keel.vendored.flash_attn against an fp64 reference of softmax(QK^T)V on fresh random data:
ragged varlen batches, paged K/V with shuffled block tables, decode from a paged cache, GQA,
windows, softcap, causal and not, head sizes, split-K, empty and one-token sequences."""

from __future__ import annotations

import pytest
import torch
from support.flash_attn_ref import attention_ref, cu, paged, tolerance, varlen_ref

from keel.vendored.flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache, last_splitkv_stats


def _qkv(gen, total_q, total_k, h, hk, d, dtype):
    q = torch.randn(total_q, h, d, generator=gen).to(dtype)
    k = torch.randn(total_k, hk, d, generator=gen).to(dtype)
    v = torch.randn(total_k, hk, d, generator=gen).to(dtype)
    return q, k, v


# (dtype, heads, kv heads, head dim, causal, window, softcap): GQA ratios 1/3/8, head dims 64/96/128/40
VARLEN_CASES = [
    (torch.float32, 4, 4, 64, True, (-1, -1), 0.0),
    (torch.bfloat16, 9, 3, 64, True, (-1, -1), 0.0),
    (torch.float16, 8, 1, 128, False, (-1, -1), 0.0),
    (torch.bfloat16, 6, 2, 96, True, (5, -1), 0.0),
    (torch.float32, 3, 1, 40, False, (3, 2), 30.0),
    (torch.float16, 4, 2, 64, False, (-1, -1), 5.0),
]


@pytest.mark.parametrize("dtype,h,hk,d,causal,window,softcap", VARLEN_CASES)
def test_varlen_matches_reference(dtype, h, hk, d, causal, window, softcap):
    gen = torch.Generator().manual_seed(hash((h, hk, d, causal, window)) % 2**31)
    lens_q = [7, 1, 0, 33, 18]
    lens_k = [7, 1, 0, 33, 18] if causal else [9, 17, 4, 33, 1]  # cross-attention lengths when not causal
    q, k, v = _qkv(gen, sum(lens_q), sum(lens_k), h, hk, d, dtype)
    out = flash_attn_varlen_func(
        q, k, v, cu(lens_q), cu(lens_k), max(lens_q), max(lens_k), causal=causal, window_size=window, softcap=softcap
    )
    ref = varlen_ref(q, k, v, lens_q, lens_k, causal=causal, window=window, softcap=softcap)
    assert out.shape == q.shape and out.dtype == dtype
    torch.testing.assert_close(out.double(), ref, **tolerance(dtype))


def test_causal_is_bottom_right_and_unseen_rows_are_zero():
    # more queries than keys: query i sees keys j <= i + sk - sq, so the first sq - sk queries see none
    gen = torch.Generator().manual_seed(1)
    q, k, v = _qkv(gen, 6, 2, 2, 1, 64, torch.float32)
    out = flash_attn_varlen_func(q, k, v, cu([6]), cu([2]), 6, 2, causal=True)
    ref = attention_ref(q, k, v, causal=True)
    torch.testing.assert_close(out.double(), ref, **tolerance(torch.float32))
    assert out[:4].abs().max() == 0 and out[4:].abs().min() > 0
    # row 4 sees only key 0: its output is v[0]
    torch.testing.assert_close(out[4], v[0].expand(2, 64), atol=1e-6, rtol=0)


def test_default_scale_is_inverse_sqrt_head_dim():
    gen = torch.Generator().manual_seed(2)
    q, k, v = _qkv(gen, 5, 5, 2, 2, 64, torch.float32)
    out = flash_attn_varlen_func(q, k, v, cu([5]), cu([5]), 5, 5)
    explicit = flash_attn_varlen_func(q, k, v, cu([5]), cu([5]), 5, 5, softmax_scale=0.125)
    other = flash_attn_varlen_func(q, k, v, cu([5]), cu([5]), 5, 5, softmax_scale=0.5)
    torch.testing.assert_close(out, explicit, atol=0, rtol=0)
    torch.testing.assert_close(other.double(), attention_ref(q, k, v, scale=0.5), **tolerance(torch.float32))


@pytest.mark.parametrize(
    "block_size,dtype,h,hk", [(16, torch.bfloat16, 9, 3), (32, torch.float32, 8, 1), (5, torch.float16, 4, 2)]
)
def test_varlen_paged_matches_reference(block_size, dtype, h, hk):
    # prefill of a chunk against a longer paged context (queries at the end of each sequence)
    gen = torch.Generator().manual_seed(block_size)
    lens_k = [40, 1, 0, 65, 16]
    lens_q = [5, 1, 0, 65, 3]
    q, k, v = _qkv(gen, sum(lens_q), sum(lens_k), h, hk, 64, dtype)
    pg = paged(k, v, lens_k, block_size, gen)
    out = flash_attn_varlen_func(
        q,
        pg.k_cache,
        pg.v_cache,
        cu(lens_q),
        None,
        max(lens_q),
        max(lens_k),
        causal=True,
        block_table=pg.block_table,
        seqused_k=pg.seqlens,
    )
    ref = varlen_ref(q, k, v, lens_q, lens_k, causal=True)
    torch.testing.assert_close(out.double(), ref, **tolerance(dtype))


# (block size, dtype, heads, kv heads, head dim, queries per sequence, window, softcap)
DECODE_CASES = [
    (16, torch.bfloat16, 9, 3, 64, 1, (-1, -1), 0.0),
    (32, torch.float16, 32, 4, 128, 1, (-1, -1), 0.0),
    (16, torch.float32, 8, 8, 96, 3, (-1, -1), 0.0),
    (32, torch.bfloat16, 8, 1, 64, 1, (20, 0), 0.0),
    (16, torch.float32, 4, 2, 64, 2, (-1, -1), 10.0),
    (24, torch.bfloat16, 6, 2, 64, 1, (-1, -1), 0.0),  # a block size that is no multiple of the 16-key tile
]


@pytest.mark.parametrize("block_size,dtype,h,hk,d,sq,window,softcap", DECODE_CASES)
def test_kvcache_paged_decode_matches_reference(block_size, dtype, h, hk, d, sq, window, softcap):
    gen = torch.Generator().manual_seed(d + h)
    lens = [70, 1, 16, 33]  # contexts crossing block boundaries, one exactly a block, one token
    b = len(lens)
    _, k, v = _qkv(gen, 0, sum(lens), h, hk, d, dtype)
    q = torch.randn(b, sq, h, d, generator=gen).to(dtype)
    pg = paged(k, v, lens, block_size, gen)
    for splits in (1, 3):
        out = flash_attn_with_kvcache(
            q,
            pg.k_cache,
            pg.v_cache,
            cache_seqlens=pg.seqlens,
            block_table=pg.block_table,
            causal=True,
            window_size=window,
            softcap=softcap,
            num_splits=splits,
        )
        assert out.shape == q.shape
        # the kernels ran `splits` splits and, when split, the combine merged one partial per split, row and head
        assert last_splitkv_stats() == (splits, splits * b * sq * h if splits > 1 else 0)
        off = 0
        for i, n in enumerate(lens):
            ref = attention_ref(q[i], k[off : off + n], v[off : off + n], causal=True, window=window, softcap=softcap)
            torch.testing.assert_close(out[i].double(), ref, **tolerance(dtype), msg=f"seq {i}, splits {splits}")
            off += n


def test_kvcache_empty_sequence_and_dense_cache():
    gen = torch.Generator().manual_seed(5)
    b, s, h, hk, d = 3, 20, 4, 2, 64
    kc = torch.randn(b, s, hk, d, generator=gen)
    vc = torch.randn(b, s, hk, d, generator=gen)
    q = torch.randn(b, 1, h, d, generator=gen)
    lens = torch.tensor([0, 20, 7], dtype=torch.int32)
    out = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens)
    assert out[0].abs().max() == 0  # no key: 0, as upstream
    for i in (1, 2):
        n = int(lens[i])
        torch.testing.assert_close(out[i].double(), attention_ref(q[i], kc[i, :n], vc[i, :n]), **tolerance(q.dtype))


def test_split_k_matches_unsplit_on_long_context():
    # on the CPU the default (0) never splits, not even a batch-1 long context (a split changes the bits:
    # tests/vendored/flash_attn/test_call_shape.py); forced splits run as asked and agree with none to rounding
    gen = torch.Generator().manual_seed(6)
    n, h, hk, d = 1500, 4, 2, 64
    _, k, v = _qkv(gen, 0, n, h, hk, d, torch.float32)
    q = torch.randn(1, 1, h, d, generator=gen)
    pg = paged(k, v, [n], 16, gen)
    ref = attention_ref(q[0], k, v)
    for splits in (0, 1, 7, 128):
        out = flash_attn_with_kvcache(
            q, pg.k_cache, pg.v_cache, cache_seqlens=pg.seqlens, block_table=pg.block_table, num_splits=splits
        )
        ran, combined = last_splitkv_stats()
        assert ran == (splits or 1), (splits, ran)
        assert combined == (ran * h if ran > 1 else 0), (ran, combined)
        torch.testing.assert_close(out[0].double(), ref, **tolerance(torch.float32), msg=f"splits {splits}")


def test_split_k_varlen_prefill_reports_its_splits():
    # packed varlen prefill, forced splits: each split's partial of every row and head is merged
    gen = torch.Generator().manual_seed(7)
    lens_q, lens_k, h, hk, d = [3, 5], [600, 700], 4, 2, 64
    q, k, v = _qkv(gen, sum(lens_q), sum(lens_k), h, hk, d, torch.float32)
    ref = varlen_ref(q, k, v, lens_q, lens_k, causal=True)
    for splits in (1, 4):
        out = flash_attn_varlen_func(q, k, v, cu(lens_q), cu(lens_k), 5, 700, causal=True, num_splits=splits)
        assert last_splitkv_stats() == (splits, splits * sum(lens_q) * h if splits > 1 else 0)
        torch.testing.assert_close(out.double(), ref, **tolerance(torch.float32), msg=f"splits {splits}")


def test_split_stats_reset_by_a_call_that_runs_no_kernel():
    q = torch.randn(1, 1, 4, 64)
    kc = torch.randn(1, 1024, 2, 64)
    flash_attn_with_kvcache(q, kc, kc.clone(), num_splits=3)
    assert last_splitkv_stats() == (3, 3 * 4)
    flash_attn_with_kvcache(q[:0], kc[:0], kc[:0].clone())  # empty batch: returns before any kernel
    assert last_splitkv_stats() == (0, 0)


def test_zero_query_heads_give_an_empty_output():
    # h = 0 passes the head checks (0 is a multiple of h_k); the kernels once divided by h / h_k = 0 (SIGFPE)
    kc = torch.randn(3, 16, 2, 64)
    table = torch.tensor([[1]], dtype=torch.int32)
    out = flash_attn_with_kvcache(torch.randn(1, 2, 0, 64), kc, kc.clone(), block_table=table, num_splits=3)
    assert out.shape == (1, 2, 0, 64) and last_splitkv_stats() == (0, 0)
    q, k = torch.randn(4, 0, 64), torch.randn(4, 2, 64)
    out = flash_attn_varlen_func(q, k, k.clone(), cu([1, 3]), cu([1, 3]), 3, 3, causal=True, num_splits=3)
    assert out.shape == (4, 0, 64) and last_splitkv_stats() == (0, 0)
