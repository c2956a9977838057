"""keel's CUDA kernels on non-finite input, on more rows than one grid holds, and on unaligned views: NaN and inf
come out where the CPU twin puts them (tests/ops/test_nonfinite.py checks the CPU twin against torch), rows past
the grid's 2^20 blocks are written (the grid-stride loops of cuda::grid_blocks), and views that are not 16-byte
aligned (the scalar path of the vector loads) equal the aligned ones. Skipped without a GPU: no GPU has run
these yet (compiled, not run).
"""

from __future__ import annotations

import pytest
import torch
from support.devices import HAS_CUDA, assert_rounded_like

from keel import ops

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")]

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SPECIAL = [float("nan"), float("inf"), float("-inf"), 88.71, -88.71, 89.0, -89.0, -104.5, 3e38, -3e38, 1e-40, -0.0]
GRID = (1 << 20) + 3  # rows: three more than cuda::kMaxGridBlocks


def sprinkled(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """randn with every special value at random positions (as tests/ops/test_nonfinite.py)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    flat = x.view(-1)
    flat[torch.randperm(flat.numel(), generator=g)[: 3 * len(SPECIAL)]] = torch.tensor(SPECIAL * 3)
    return x.to(dtype)


def same_as_cpu(cuda_out: torch.Tensor, cpu_out: torch.Tensor, max_ulps: float = 1) -> None:
    """NaN and +-inf at the CPU twin's positions; finite values as two correct roundings."""
    got = cuda_out.cpu()
    assert torch.equal(got.isnan(), cpu_out.isnan()), "NaN positions differ from the CPU twin"
    assert torch.equal(got.isinf(), cpu_out.isinf()), "inf positions differ from the CPU twin"
    assert torch.equal(got[got.isinf()], cpu_out[cpu_out.isinf()]), "inf signs differ from the CPU twin"
    fin = cpu_out.isfinite()
    if got.dtype == torch.float32:
        torch.testing.assert_close(got[fin], cpu_out[fin], rtol=1e-6, atol=1e-30)
    else:
        assert_rounded_like(got[fin], cpu_out[fin], got.dtype, max_ulps=max_ulps)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_nonfinite(dtype):
    x = sprinkled((6, 256), dtype, 1)
    same_as_cpu(ops.silu_and_mul(x.cuda()), ops.silu_and_mul(x), max_ulps=3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_muladd_nonfinite(dtype):
    a, b = sprinkled((5, 264), dtype, 3), sprinkled((5, 264), dtype, 4)
    same_as_cpu(ops.fused_muladd(a.cuda(), b.cuda(), 0.5), ops.fused_muladd(a, b, 0.5))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_nonfinite(dtype):
    x, w = sprinkled((8, 264), dtype, 5), torch.randn(264).to(dtype)
    same_as_cpu(ops.rms_norm(x.cuda(), w.cuda(), 1e-6), ops.rms_norm(x, w, 1e-6), max_ulps=3)
    x[:, :] = torch.randn(8, 264).to(dtype)
    x[2, 7] = float("nan")  # one NaN poisons its row only
    x[5, 9] = float("inf")  # one inf: the row's scale is 0, so the row is 0 and inf * 0 = NaN (as torch)
    got = ops.rms_norm(x.cuda(), w.cuda(), 1e-6).cpu()
    assert got[2].isnan().all() and got[[0, 1, 3, 4, 6, 7]].isfinite().all()
    assert got[5, 9].isnan() and bool((got[5, torch.arange(264) != 9] == 0).all())


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm_nonfinite(dtype):
    x, res, w = sprinkled((8, 264), dtype, 5), sprinkled((8, 264), dtype, 6), torch.randn(264).to(dtype)
    xc, rc = x.cuda(), res.cuda()
    ops.fused_add_rms_norm(xc, rc, w.cuda(), 1e-6)
    ops.fused_add_rms_norm(x, res, w, 1e-6)
    same_as_cpu(rc, res)
    same_as_cpu(xc, x, max_ulps=3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_embedding_nonfinite(dtype):
    pos = torch.arange(6)
    inv = 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16))
    freqs = torch.outer(torch.arange(8).float(), inv)
    cache = torch.cat([freqs.cos(), freqs.sin()], -1)
    q, k = sprinkled((6, 32), dtype, 7), sprinkled((6, 16), dtype, 8)
    qc, kc = q.cuda(), k.cuda()
    ops.rotary_embedding(pos.cuda(), qc, kc, 16, cache.cuda(), True)
    ops.rotary_embedding(pos, q, k, 16, cache, True)
    same_as_cpu(qc, q)
    same_as_cpu(kc, k)


def test_reshape_and_cache_nonfinite_bits():
    key = sprinkled((3, 2, 8), torch.bfloat16, 10)
    kc = torch.zeros(2, 4, 2, 8, dtype=torch.bfloat16, device="cuda")
    vc = torch.zeros_like(kc)
    ops.reshape_and_cache(key.cuda(), key.cuda(), kc, vc, torch.tensor([0, 5, 7], device="cuda"))
    assert torch.equal(kc.cpu().view(-1, 2, 8)[[0, 5, 7]].view(torch.int16), key.view(torch.int16))


# more rows than cuda::kMaxGridBlocks: the grid-stride loops must reach the last rows


def test_rms_norm_past_the_grid():
    x, w = torch.randn(GRID, 8, device="cuda"), torch.randn(8, device="cuda")
    got = ops.rms_norm(x, w, 1e-6)
    torch.testing.assert_close(got, w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def test_silu_and_mul_past_the_grid():
    x = torch.randn(GRID, 16, device="cuda")
    torch.testing.assert_close(ops.silu_and_mul(x), torch.nn.functional.silu(x[:, :8]) * x[:, 8:])


def test_rotary_embedding_past_the_grid():
    pos = torch.arange(GRID, device="cuda") % 4
    cache = torch.randn(4, 8, device="cuda")
    q, k = torch.randn(GRID, 8, device="cuda"), torch.randn(GRID, 8, device="cuda")
    qc, kc = q.clone(), k.clone()
    ops.rotary_embedding(pos, qc, kc, 8, cache, True)
    cos, sin = cache[pos].chunk(2, -1)
    x1, x2 = q.chunk(2, -1)
    torch.testing.assert_close(qc, torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1))
    assert not torch.equal(kc[-1], k[-1])


def test_reshape_and_cache_past_the_grid():
    key = torch.randn(GRID, 1, 8, device="cuda")
    kc = torch.zeros(GRID // 16 + 1, 16, 1, 8, device="cuda")
    vc = torch.zeros_like(kc)
    ops.reshape_and_cache(key, key, kc, vc, torch.arange(GRID, device="cuda"))
    assert torch.equal(kc.view(-1, 1, 8)[:GRID], key)


# the vector loads (16 bytes) take a scalar path for views that are not 16-byte aligned


@pytest.mark.parametrize("dtype", [*DTYPES, torch.float64])
@pytest.mark.parametrize("offset", [0, 1, 3])
def test_fused_muladd_unaligned(dtype, offset):
    a, b = torch.randn(1000 + offset).to(dtype), torch.randn(1000 + offset).to(dtype)
    got = ops.fused_muladd(a.cuda()[offset:], b.cuda()[offset:], 0.25)
    torch.testing.assert_close(got.cpu(), ops.fused_muladd(a[offset:], b[offset:], 0.25), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [8, 13, 264])
@pytest.mark.parametrize("offset", [0, 1])
def test_silu_and_mul_and_rms_norm_unaligned(dtype, d, offset):
    x = torch.randn(5, 2 * d + offset).to(dtype)
    view = x[:, offset:]
    assert_rounded_like(ops.silu_and_mul(x.cuda()[:, offset:]).cpu(), ops.silu_and_mul(view), dtype, max_ulps=3)
    w = torch.randn(2 * d).to(dtype)
    assert_rounded_like(ops.rms_norm(x.cuda()[:, offset:], w.cuda(), 1e-6).cpu(), ops.rms_norm(view, w, 1e-6), dtype, 3)


@pytest.mark.parametrize("offset", [0, 1])
def test_reshape_and_cache_vector_and_scalar_copies(offset):
    """Aligned heads take the 16-byte copies, heads one element off take the element copies: the same bits."""
    big = torch.randn(5, 2, 17).to(torch.bfloat16)
    key = big[:, :, offset : offset + 16]
    kc = torch.zeros(2, 4, 2, 16, dtype=torch.bfloat16, device="cuda")
    vc = torch.zeros_like(kc)
    slots = torch.tensor([0, 5, 7, -1, 2])
    ops.reshape_and_cache(big.cuda()[:, :, offset : offset + 16], big.cuda()[:, :, offset : offset + 16], kc, vc,
                          slots.cuda())  # fmt: skip
    kc_cpu, vc_cpu = torch.zeros(2, 4, 2, 16, dtype=torch.bfloat16), torch.zeros(2, 4, 2, 16, dtype=torch.bfloat16)
    ops.reshape_and_cache(key, key, kc_cpu, vc_cpu, slots)
    assert torch.equal(kc.cpu().view(torch.int16), kc_cpu.view(torch.int16))
    assert torch.equal(vc.cpu().view(torch.int16), vc_cpu.view(torch.int16))


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_nonfinite(dtype):
    # NaN and infinities only (as tests/ops/test_nonfinite.py): where a sum overflows depends on its order
    g = torch.Generator().manual_seed(9)
    x, w = torch.randn(20, 24, generator=g), torch.randn(16, 24, generator=g).to(dtype)
    x.view(-1)[torch.randperm(480, generator=g)[:9]] = torch.tensor([float("nan"), float("inf"), float("-inf")] * 3)
    x = x.to(dtype)
    got = ops.linear(x.cuda(), w.cuda(), None).cpu()
    want = torch.nn.functional.linear(x.double(), w.double())
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.isinf(), want.to(dtype).isinf())
