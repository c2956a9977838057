"""flash_attn's CUDA kernel on non-finite input: NaN and inf come out where the CPU twin puts them (a NaN or
+inf score makes the query's row NaN, as in torch's SDPA; the rule itself is tested on the host in
test_online_softmax_rule.py), and rows that see no bad key stay equal to the CPU twin's. Skipped without a GPU:
no GPU has run these yet (compiled, not run).
"""

from __future__ import annotations

import pytest
import torch
from support.flash_attn_ref import cu, tolerance

from keel.vendored.flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

LENS = [7, 40, 3]


def _inputs(dtype: torch.dtype, where: str, bad: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    n = sum(LENS)
    q, k, v = (torch.randn(n, 4, 64, generator=gen) for _ in range(3))
    {"q": q, "k": k, "v": v}[where][9, 1, 5] = bad  # sequence 1, head 1 (kv head 0 under GQA 4:2)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _same_as_cpu(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    got = got.cpu()
    assert torch.equal(got.isnan(), want.isnan()), "NaN positions differ from the CPU twin"
    assert torch.equal(got.isinf(), want.isinf()), "inf positions differ from the CPU twin"
    fin = want.isfinite()
    tol = {name: 2 * v for name, v in tolerance(dtype).items()}
    torch.testing.assert_close(got[fin].float(), want[fin].float(), **tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("where,bad", [("q", float("nan")), ("k", float("nan")), ("k", float("inf")),
                                       ("v", float("nan")), ("v", float("inf")), ("k", float("-inf"))])  # fmt: skip
@pytest.mark.parametrize("causal", [True, False])
def test_varlen_nonfinite_as_cpu(dtype, where, bad, causal):
    q, k, v = _inputs(dtype, where, bad)
    kw = dict(causal=causal)
    args = (cu(LENS), cu(LENS), max(LENS), max(LENS))
    want = flash_attn_varlen_func(q, k[:, :2], v[:, :2], *args, **kw)
    got = flash_attn_varlen_func(
        q.cuda(), k[:, :2].cuda(), v[:, :2].cuda(), *(a.cuda() for a in args[:2]), *args[2:], **kw
    )
    if where != "v" and bad != float("-inf"):
        assert want.isnan().any(), "the CPU twin gives NaN here (and torch's SDPA)"
    _same_as_cpu(got, want, dtype)


def test_kvcache_nan_key_makes_the_decode_row_nan():
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 1, 4, 64, generator=gen)
    kc, vc = torch.randn(2, 50, 2, 64, generator=gen), torch.randn(2, 50, 2, 64, generator=gen)
    kc[1, 33, 0, 0] = float("nan")  # sequence 1, kv head 0: query heads 0 and 1
    lens = torch.tensor([50, 40], dtype=torch.int32)
    want = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens)
    got = flash_attn_with_kvcache(q.cuda(), kc.cuda(), vc.cuda(), cache_seqlens=lens.cuda()).cpu()
    assert want[1, 0, :2].isnan().all() and want[0].isfinite().all() and want[1, 0, 2:].isfinite().all()
    _same_as_cpu(got, want, torch.float32)
