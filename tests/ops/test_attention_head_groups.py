"""The vendored attention kernels' CPU decode paths that work on several query rows at once (the query
heads that share a kv head: P.V over their bf16 value rows read in place, the interleaved softmax sums)
and the per-thread scratch buffers kept between calls. Each query head's output must be bit for bit what
a call holding that head alone gives (the reference tests in tests/vendored/flash_attn hold both to
fp64), and a call must not depend on what the thread's previous call left in its scratch."""

from __future__ import annotations

import pytest
import torch

from keel.vendored.flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (a NaN equals the same NaN)."""
    return a.shape == b.shape and a.contiguous().view(torch.uint8).equal(b.contiguous().view(torch.uint8))


def _paged(gen, lens, block_size, hk, d, dtype):
    blocks = [(n + block_size - 1) // block_size for n in lens]
    num_blocks = sum(blocks) + 2
    k_cache = torch.randn(num_blocks, block_size, hk, d, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, hk, d, generator=gen).to(dtype)
    order = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    table = torch.zeros(len(lens), max(blocks), dtype=torch.int32)
    at = 0
    for i, n in enumerate(blocks):
        table[i, :n] = order[at : at + n]
        at += n
    return k_cache, v_cache, table, torch.tensor(lens, dtype=torch.int32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 136])  # one 64-column pass; 2 x 64 + 8 (a masked tail)
@pytest.mark.parametrize("group", [3, 5, 9])  # query heads per kv head: 3 rows, 4 + 1, 2 x 4 + 1
def test_decode_heads_of_a_kv_head_match_each_head_alone(dtype, d, group):
    gen = torch.Generator().manual_seed(d * group)
    hk, lens = 2, [70, 1, 16, 33]
    k_cache, v_cache, table, seqlens = _paged(gen, lens, 16, hk, d, dtype)
    q = torch.randn(len(lens), 1, group * hk, d, generator=gen).to(dtype)
    out = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table, causal=True)
    for h in range(group * hk):
        kv = h // group
        alone = flash_attn_with_kvcache(
            q[:, :, h : h + 1].contiguous(),
            k_cache[:, :, kv : kv + 1].contiguous(),
            v_cache[:, :, kv : kv + 1].contiguous(),
            cache_seqlens=seqlens,
            block_table=table,
            causal=True,
        )
        assert _same_bits(out[:, :, h : h + 1], alone), f"head {h} (kv head {kv})"


@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_rows_without_visible_keys_in_a_tile_match_each_head_alone(dtype):
    """Several query positions per item under a short window: early key tiles are invisible to the later
    rows (their P row is skipped), and non-finite values sit in the cache."""
    gen = torch.Generator().manual_seed(7)
    h, hk, d, lens, sq = 6, 2, 64, [90, 40], [5, 3]
    k_cache, v_cache, table, seqlens = _paged(gen, lens, 16, hk, d, dtype)
    v_cache[table[0, 1], 3, 0, :5] = float("inf")
    k_cache[table[1, 0], 2, 1, 7] = float("nan")
    q = torch.randn(sum(sq), h, d, generator=gen).to(dtype)
    cu = torch.tensor([0, sq[0], sq[0] + sq[1]], dtype=torch.int32)

    def attend(q_, kc, vc):
        return flash_attn_varlen_func(
            q_,
            kc,
            vc,
            cu,
            None,
            max(sq),
            max(lens),
            causal=True,
            window_size=(3, 0),
            block_table=table,
            seqused_k=seqlens,
        )

    out = attend(q, k_cache, v_cache)
    group = h // hk
    for head in range(h):
        kv = head // group
        alone = attend(
            q[:, head : head + 1].contiguous(),
            k_cache[:, :, kv : kv + 1].contiguous(),
            v_cache[:, :, kv : kv + 1].contiguous(),
        )
        assert _same_bits(out[:, head : head + 1], alone), f"head {head}"


def test_a_call_does_not_depend_on_the_previous_calls_scratch():
    gen = torch.Generator().manual_seed(3)
    small = _paged(gen, [37], 16, 1, 64, torch.bfloat16)
    q_small = torch.randn(1, 1, 3, 64, generator=gen).to(torch.bfloat16)
    big = _paged(gen, [300, 200], 32, 4, 256, torch.bfloat16)  # (one scratch per thread and dtype)
    q_big = torch.randn(2, 1, 32, 256, generator=gen).to(torch.bfloat16)
    big[1][:, :, 0] = float("inf")  # kv head 0's values: that call leaves inf rows in the thread's scratch

    def run_small():
        kc, vc, table, lens = small
        return flash_attn_with_kvcache(q_small, kc, vc, cache_seqlens=lens, block_table=table)

    first = run_small()
    kc, vc, table, lens = big
    flash_attn_with_kvcache(q_big, kc, vc, cache_seqlens=lens, block_table=table)
    assert _same_bits(run_small(), first)
