"""Every op matches torch on nan / inf / huge inputs: nan where torch gives nan, the same infinities,
and the finite values as close as on ordinary inputs (exp_f32's edges: overflow, underflow, nan)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from support.devices import assert_rounded_like

from keel import ops

SPECIAL = [
    float("nan"),
    float("inf"),
    float("-inf"),
    88.71,
    -88.71,
    89.0,
    -89.0,
    100.0,
    -100.0,
    -104.5,
    3e38,
    -3e38,
    1e-40,
    -0.0,
]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def sprinkled(shape: tuple[int, ...], dtype: torch.dtype, seed: int, special: list[float] = SPECIAL) -> torch.Tensor:
    """randn with every special value placed at random positions."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    flat = x.view(-1)
    idx = torch.randperm(flat.numel(), generator=g)[: 3 * len(special)]
    flat[idx] = torch.tensor(special * 3)
    return x.to(dtype)


def same_nonfinite(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, max_ulps: float | None = 1) -> None:
    want = want.to(dtype)
    if dtype == torch.float32:
        assert torch.equal(got.isnan(), want.isnan()), "nan positions differ"
        fin = ~want.isnan()
        torch.testing.assert_close(got[fin], want[fin], rtol=1e-5, atol=1e-30)
    else:
        assert_rounded_like(got, want, dtype, max_ulps=max_ulps)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(dtype):
    x = sprinkled((6, 64), dtype, 1)
    x[:, 32:] = 1.0  # up = 1: the activation itself is compared
    same_nonfinite(ops.silu_and_mul(x), F.silu(x[:, :32]) * x[:, 32:], dtype, max_ulps=3)
    y = sprinkled((6, 64), dtype, 2)  # and nan/inf in both halves
    same_nonfinite(ops.silu_and_mul(y), F.silu(y[:, :32]) * y[:, 32:], dtype, max_ulps=3)


def test_silu_edges_exact():
    # edge values: silu(-inf) is nan in torch; exp overflow just below ln(FLT_MAX)
    g = torch.tensor([-float("inf"), float("inf"), float("nan"), -88.71, 88.71, -87.5, -90.0, -104.5])
    got = ops.silu_and_mul(torch.cat([g, torch.ones_like(g)])[None])[0]
    want = F.silu(g)
    assert torch.equal(got.isnan(), want.isnan())
    fin = ~want.isnan()
    torch.testing.assert_close(got[fin], want[fin], rtol=2e-6, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_muladd(dtype):
    a, b = sprinkled((5, 33), dtype, 3), sprinkled((5, 33), dtype, 4)
    same_nonfinite(ops.fused_muladd(a, b, 0.5), a.float() * b.float() + 0.5, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_and_fused_add(dtype):
    x, w = sprinkled((8, 40), dtype, 5), torch.randn(40).to(dtype)
    xf = x.float()
    want = w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
    same_nonfinite(ops.rms_norm(x, w, 1e-6), want, dtype, max_ulps=3)
    res = sprinkled((8, 40), dtype, 6)
    new_res = x + res
    nf = new_res.float()
    want_x = w * (nf * torch.rsqrt(nf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
    xx, rr = x.clone(), res.clone()
    ops.fused_add_rms_norm(xx, rr, w, 1e-6)
    same_nonfinite(rr, new_res, dtype)
    same_nonfinite(xx, want_x, dtype, max_ulps=3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_embedding(dtype):
    pos = torch.arange(6)
    inv = 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16))
    freqs = torch.outer(torch.arange(8).float(), inv)
    cache = torch.cat([freqs.cos(), freqs.sin()], -1)

    def reference(x: torch.Tensor) -> torch.Tensor:  # NeoX halves, in float32, one rounding
        xs = x.float().view(6, -1, 16)
        cos, sin = cache[pos].chunk(2, -1)
        x1, x2 = xs.chunk(2, -1)
        c, s = cos[:, None], sin[:, None]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1).view(x.shape)

    q, k = sprinkled((6, 32), dtype, 7), sprinkled((6, 16), dtype, 8)
    want_q, want_k = reference(q), reference(k)
    ops.rotary_embedding(pos, q, k, 16, cache, True)
    same_nonfinite(q, want_q, dtype)
    same_nonfinite(k, want_k, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [3, 20])
def test_linear(dtype, rows):
    # nan and infinities only: whether a long sum of huge finite values overflows depends on its order
    x, w = sprinkled((rows, 24), dtype, 9, [float("nan"), float("inf"), float("-inf")]), torch.randn(16, 24).to(dtype)
    got = ops.linear(x, w, None)
    want = F.linear(x.double(), w.double())
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.isinf(), want.to(dtype).isinf())


def test_reshape_and_cache_copies_bits():
    key = sprinkled((3, 2, 8), torch.bfloat16, 10)
    kc, vc = torch.zeros(2, 4, 2, 8, dtype=torch.bfloat16), torch.zeros(2, 4, 2, 8, dtype=torch.bfloat16)
    ops.reshape_and_cache(key, key.clone(), kc, vc, torch.tensor([0, 5, 7]))
    assert torch.equal(kc.view(-1, 2, 8)[[0, 5, 7]].view(torch.int16), key.view(torch.int16))
