"""The CUDA twin against the fp64 reference (skipped without a GPU: compiled, never run here)."""

from __future__ import annotations

import pytest
import torch
from flash_attn_ref import attention_ref, cu, paged, tolerance, varlen_ref

from keel.vendored.flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_cuda_varlen_paged_and_decode_match_reference(dtype):
    gen = torch.Generator().manual_seed(0)
    lens_q, lens_k = [7, 1, 0, 40], [7, 1, 0, 70]
    h, hk, d = 9, 3, 64
    q = torch.randn(sum(lens_q), h, d, generator=gen).to(dtype)
    k = torch.randn(sum(lens_k), hk, d, generator=gen).to(dtype)
    v = torch.randn(sum(lens_k), hk, d, generator=gen).to(dtype)
    ref = varlen_ref(q, k, v, lens_q, lens_k, causal=True, window=(20, -1), softcap=10.0)
    out = flash_attn_varlen_func(
        q.cuda(),
        k.cuda(),
        v.cuda(),
        cu(lens_q).cuda(),
        cu(lens_k).cuda(),
        40,
        70,
        causal=True,
        window_size=(20, -1),
        softcap=10.0,
    )
    torch.testing.assert_close(out.cpu().double(), ref, **tolerance(dtype))
    pg = paged(k, v, lens_k, 16, gen)
    out = flash_attn_varlen_func(
        q.cuda(),
        pg.k_cache.cuda(),
        pg.v_cache.cuda(),
        cu(lens_q).cuda(),
        None,
        40,
        70,
        causal=True,
        window_size=(20, -1),
        softcap=10.0,
        block_table=pg.block_table.cuda(),
        seqused_k=pg.seqlens.cuda(),
    )
    torch.testing.assert_close(out.cpu().double(), ref, **tolerance(dtype))
    qd = torch.randn(len(lens_k), 1, h, d, generator=gen).to(dtype)
    out = flash_attn_with_kvcache(
        qd.cuda(),
        pg.k_cache.cuda(),
        pg.v_cache.cuda(),
        cache_seqlens=pg.seqlens.cuda(),
        block_table=pg.block_table.cuda(),
    ).cpu()
    off = 0
    for i, n in enumerate(lens_k):
        torch.testing.assert_close(
            out[i].double(), attention_ref(qd[i], k[off : off + n], v[off : off + n]), **tolerance(dtype)
        )
        off += n
