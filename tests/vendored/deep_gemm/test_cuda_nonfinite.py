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
    x[1, 5] = bad
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
    assert dg.calc_diff(got[fin], want[fin]) < 1e-9


def test_bf16_gemm_nonfinite_as_cpu():
    a = _with_bad(3, 256, float("nan")).to(torch.bfloat16)
    b = torch.randn(70, 256).to(torch.bfloat16)
    want = torch.empty(3, 70)
    dg.bf16_gemm_nt(a, b, want)
    d = torch.empty(3, 70, device="cuda")
    dg.bf16_gemm_nt(a.cuda(), b.cuda(), d)
    assert torch.equal(d.cpu().isnan(), want.isnan()) and want.isnan().any()
