"""deep_gemm's CUDA GEMMs and casts on non-finite input: NaN and inf come out where the CPU twin puts them
(an e4m3 NaN byte decodes to NaN through the hardware conversion; the casts' amax ignores NaN as the host's
std::fmax does, so the cast bytes equal the CPU's); finite outputs equal the CPU twin's. Skipped without a GPU:
no GPU has run these yet (compiled, not run).
"""

from __future__ import annotations

import pytest
import torch

from keel.vendored import deep_gemm as dg

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _with_bad(m: int, k: int, bad: float) -> torch.Tensor:
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m + k))
    x[0, 5] = bad
    x[m - 1, k - 1] = -bad
    return x


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_casts_nonfinite_equal_cpu_bytes(bad):
    x = _with_bad(6, 300, bad)
    for cast in (dg.per_token_cast_to_fp8, dg.per_block_cast_to_fp8):
        got, want = cast(x.cuda()), cast(x)
        assert torch.equal(got[0].cpu().view(torch.uint8), want[0].view(torch.uint8)), cast.__name__
        assert torch.equal(got[1].cpu(), want[1]), cast.__name__


@pytest.mark.parametrize("m", [1, 4, 33])  # decode shapes (split-K GEMV) and a prefill shape
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_fp8_gemm_nonfinite_as_cpu(m, bad):
    n, k = 130, 384
    a = dg.per_token_cast_to_fp8(_with_bad(m, k, bad))
    b = dg.per_block_cast_to_fp8(torch.randn(n, k, generator=torch.Generator().manual_seed(2)) * 0.05)
    a[0].view(torch.uint8)[0, 7] = 0x7F  # an e4m3 NaN byte in row 0
    d = torch.empty(m, n, device="cuda")
    dg.fp8_gemm_nt((a[0].cuda(), a[1].cuda()), (b[0].cuda(), b[1].cuda()), d)
    want = torch.empty(m, n)
    dg.fp8_gemm_nt(a, b, want)
    got = d.cpu()
    assert want[0].isnan().all()
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    fin = want.isfinite()
    if fin.any():  # m = 1: the one row holds the NaN byte
        assert dg.calc_diff(got[fin], want[fin]) < 1e-9


def test_bf16_gemm_nonfinite_as_cpu():
    a = _with_bad(3, 256, float("nan")).to(torch.bfloat16)
    b = torch.randn(70, 256).to(torch.bfloat16)
    want = torch.empty(3, 70)
    dg.bf16_gemm_nt(a, b, want)
    d = torch.empty(3, 70, device="cuda")
    dg.bf16_gemm_nt(a.cuda(), b.cuda(), d)
    assert torch.equal(d.cpu().isnan(), want.isnan()) and want.isnan().any()


@pytest.mark.parametrize("m,n,k", [(1, 70, 384), (5, 33, 260), (130, 9, 128)])
def test_gemm_vector_and_element_loads_agree_bitwise(m, n, k):
    """The 4-/8-byte loads (aligned rows) and the element loads (rows shifted by one element) sum in the same
    order: the same bits, for e4m3 and bf16; and both equal the CPU twin within the fp32 threshold."""
    g = torch.Generator().manual_seed(m * n + k)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) * 0.05
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(w)

    def shifted(t: torch.Tensor) -> torch.Tensor:  # the same values, the row start one element off alignment
        big = torch.zeros(t.shape[0], t.shape[1] + 1, dtype=t.dtype, device="cuda")
        big[:, 1:] = t.cuda()
        return big[:, 1:]

    outs = []
    for a0, b0 in ((a[0].cuda(), b[0].cuda()), (shifted(a[0]), shifted(b[0]))):
        d = torch.empty(m, n, device="cuda")
        dg.fp8_gemm_nt((a0, a[1].cuda()), (b0, b[1].cuda()), d)
        outs.append(d.cpu())
    assert torch.equal(outs[0], outs[1])
    want = torch.empty(m, n)
    dg.fp8_gemm_nt(a, b, want)
    assert dg.calc_diff(outs[0], want) < 1e-9
    xb, wb = x.to(torch.bfloat16), w.to(torch.bfloat16)
    bf = []
    for a0, b0 in ((xb.cuda(), wb.cuda()), (shifted(xb), shifted(wb))):
        d = torch.empty(m, n, device="cuda")
        dg.bf16_gemm_nt(a0, b0, d)
        bf.append(d.cpu())
    assert torch.equal(bf[0], bf[1])
