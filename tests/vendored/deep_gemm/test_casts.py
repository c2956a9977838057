"""per_token_cast_to_fp8 / per_block_cast_to_fp8: e4m3fn rounding (nearest even) equal to torch's,
NaN kept, scales amax / 448 (UE8M0: power-of-two ceiling), partial groups and blocks, bad inputs."""

from __future__ import annotations

import pytest
import torch
from support.dg_reference import dequant_per_block, dequant_per_token

from keel.vendored import deep_gemm as dg

FP8 = torch.float8_e4m3fn
OPS = torch.ops.keel_deep_gemm


def test_rounding_matches_torch_when_scale_is_one():
    # each 128-group holds 448, so its scale is exactly 1 and the cast is plain e4m3fn rounding:
    # subnormals, ties, the largest finite value and everything between
    g = torch.Generator().manual_seed(0)
    vals = torch.cat(
        [
            torch.randn(2000, generator=g) * 50,
            torch.randn(2000, generator=g) * 0.01,
            torch.tensor([0.0, -0.0, 2**-9, 2**-10, 3 * 2**-10, 2**-6, 0.0146, 447.9, 440.0, 432.0, -448.0]),
            (torch.arange(0, 120) + 0.5) * 2**-9,
        ]
    )
    vals = vals.clamp(-448, 448)
    cols = 127
    rows = -(-vals.numel() // cols)
    x = torch.zeros(rows * cols)
    x[: vals.numel()] = vals
    x = torch.cat([torch.full((rows, 1), 448.0), x.view(rows, cols)], dim=1)
    q, sf = dg.per_token_cast_to_fp8(x)
    assert torch.equal(sf, torch.ones(rows, 1))
    assert torch.equal(q.view(torch.uint8), x.to(FP8).view(torch.uint8))


def test_nan_and_scales():
    x = torch.randn(3, 300)
    x[1, 5] = float("nan")
    x[2, :128] = 0.0
    q, sf = dg.per_token_cast_to_fp8(x)
    assert sf.shape == (3, 3) and q.dtype == FP8
    assert bool(q[1, 5].float().isnan()) and int(q.float().isnan().sum()) == 1
    amax = torch.nn.functional.pad(x.abs(), (0, 84)).view(3, 3, 128).nan_to_num(0).amax(-1).clamp(min=1e-4)
    torch.testing.assert_close(sf, amax / 448, rtol=1e-7, atol=0)
    _, sf8 = dg.per_token_cast_to_fp8(x, use_ue8m0=True)
    assert torch.equal(sf8, torch.exp2(torch.ceil(torch.log2(amax / 448))))


@pytest.mark.parametrize("gran_k", [128, 32])
def test_per_token_round_trip(gran_k):
    x = torch.randn(5, 200).bfloat16()
    q, sf = dg.per_token_cast_to_fp8(x, gran_k=gran_k)
    assert sf.shape == (5, -(-200 // gran_k))
    back = dequant_per_token(q, sf, gran_k)
    assert dg.calc_diff(back, x) < 1e-3
    # e4m3 keeps 3 mantissa bits: each element within half an ulp of its group's grid
    assert bool(
        (
            (back - x.double()).abs()
            <= x.double().abs() * 2**-4 + sf.double().repeat_interleave(gran_k, 1)[:, :200] * 2**-9
        ).all()
    )


def test_per_block_partial_blocks():
    x = torch.randn(130, 260)
    x[129, 259] = 1000.0  # the last, partial block has its own scale
    q, sf = dg.per_block_cast_to_fp8(x)
    assert q.shape == (130, 260) and sf.shape == (2, 3)
    assert sf[1, 2] == pytest.approx(1000.0 / 448, rel=1e-7)
    assert sf[0, 0] == pytest.approx(float(x[:128, :128].abs().max()) / 448, rel=1e-7)
    assert dg.calc_diff(dequant_per_block(q, sf), x) < 1e-3


def test_cast_bad_inputs():
    with pytest.raises(RuntimeError, match=r"keel_deep_gemm::per_token_cast_to_fp8: gran_k must fit in a 32-bit int"):
        dg.per_token_cast_to_fp8(torch.zeros(2, 4), gran_k=2**40)
    with pytest.raises(RuntimeError, match=r"keel_deep_gemm::per_token_cast_to_fp8: gran_k must be positive, got 0"):
        dg.per_token_cast_to_fp8(torch.zeros(2, 4), gran_k=0)
    with pytest.raises(RuntimeError, match=r"keel_deep_gemm::per_block_cast_to_fp8: x must be 2-D"):
        dg.per_block_cast_to_fp8(torch.zeros(2, 4, 4))
    with pytest.raises(
        RuntimeError, match=r"keel_deep_gemm::per_token_cast_to_fp8: x must be bfloat16 or float32, got"
    ):
        dg.per_token_cast_to_fp8(torch.zeros(2, 4).to(FP8))
    with pytest.raises(RuntimeError, match=r"keel_deep_gemm::per_token_cast_to_fp8: x must be float8_e4m3fn, bfloat16"):
        dg.per_token_cast_to_fp8(torch.zeros(2, 4, dtype=torch.int32))


def test_opcheck_casts():
    torch.library.opcheck(OPS.per_token_cast_to_fp8.default, (torch.randn(3, 200), False, 128))
    torch.library.opcheck(OPS.per_block_cast_to_fp8.default, (torch.randn(130, 20).bfloat16(), True))


def test_ue8m0_scale_is_never_below_amax_over_448():
    # amax just above 448 * 2^k: float32 log2 of amax / 448 rounds to k, so 2^ceil(log2(s)) computed in
    # float gives 2^k < s (values would saturate); the scale must be the power of two at or above s
    found = []
    for k in range(2, 12):
        a = torch.tensor(448.0 * 2**k)
        for _ in range(64):
            a = torch.nextafter(a, torch.tensor(float("inf")))
            if float(a / 448) > 2.0**k and float(torch.log2(a / 448)) == k:
                found.append(float(a))
                break
    assert len(found) >= 4, "no amax whose float32 log2 rounds down: the case this test is about is missing"
    x = torch.tensor(found).view(-1, 1)
    exact = torch.exp2(torch.ceil(torch.log2((x / 448).double()))).view(-1)
    q, sf = dg.per_token_cast_to_fp8(x, use_ue8m0=True)  # one group per row
    assert torch.equal(sf.double().view(-1), exact)
    assert not bool((q.float().abs() == 448).any()), "a value saturated: its scale was below amax / 448"
    q, sf = dg.per_block_cast_to_fp8(x, use_ue8m0=True)  # one block: the largest amax
    assert float(sf) == float(exact.max()) and not bool((q.float().abs() == 448).any())
