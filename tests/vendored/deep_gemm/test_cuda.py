"""deep_gemm's CUDA twin against its CPU twin and float64 references: fp8_gemm_nt with M, N, K not multiples
of 128, both weight recipes, strided d, c present and absent; bf16_gemm_nt; the casts (per-token 1 x gran_k,
the engine's 1x128 weight recipe, 128 x 128 blocks), which must write the CPU casts' bytes exactly; devices
refused. Skipped without a GPU: no GPU has run these yet (compiled, not run).

Thresholds (DeepGEMM's calc_diff, 0 when equal): against float64 of the same dequantized inputs, 1e-9 for
an fp32 d and 2e-5 for bf16 (one rounding of each output); CUDA against the CPU twin, the same (both are
fp32 accumulations in different orders); against the unquantized inputs, DeepGEMM's 1e-3.
"""

from __future__ import annotations

import pytest
import torch
from support.dg_reference import dequant_per_block, dequant_per_token

from keel.vendored import deep_gemm as dg

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

FP8 = torch.float8_e4m3fn
EXACT = {torch.float32: 1e-9, torch.bfloat16: 2e-5}
SHAPES = [(1, 200, 300), (33, 130, 129), (130, 257, 384), (4, 96, 64)]


def _inputs(m: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) * 0.05


def _cuda(pair: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return pair[0].cuda(), pair[1].cuda()


def _weights(w: torch.Tensor, recipe: tuple[int, int, int]):
    """The weight pair for a recipe: 128x128 blocks (1, 128, 128) or 1x128 rows (1, 1, 128), and its fp64 value."""
    if recipe == (1, 128, 128):
        b, sfb = dg.per_block_cast_to_fp8(w)
        return (b, sfb), dequant_per_block(b, sfb)
    b, sfb = dg.per_token_cast_to_fp8(w)
    return (b, sfb), dequant_per_token(b, sfb)


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("recipe", [(1, 128, 128), (1, 1, 128)])
@pytest.mark.parametrize(
    "d_dtype,c_dtype",
    [(torch.float32, None), (torch.bfloat16, torch.float32), (torch.bfloat16, None), (torch.float32, torch.bfloat16)],
)
def test_fp8_gemm_matches_cpu_and_reference(m, n, k, recipe, d_dtype, c_dtype):
    x, w = _inputs(m, n, k, seed=m + n + k)
    a = dg.per_token_cast_to_fp8(x)
    b, b64 = _weights(w, recipe)
    c = None if c_dtype is None else torch.randn(m, n).to(c_dtype)
    d = torch.empty(m, n, dtype=d_dtype, device="cuda")
    dg.fp8_gemm_nt(_cuda(a), _cuda(b), d, c=None if c is None else c.cuda(), recipe=recipe)
    ref = dequant_per_token(*a) @ b64.T + (0 if c is None else c.double())
    assert dg.calc_diff(d.cpu(), ref) < EXACT[d_dtype]
    d_cpu = torch.empty(m, n, dtype=d_dtype)
    dg.fp8_gemm_nt(a, b, d_cpu, c=c, recipe=recipe)
    assert dg.calc_diff(d.cpu(), d_cpu) < EXACT[d_dtype]
    assert dg.calc_diff(d.cpu(), x.double() @ w.double().T + (0 if c is None else c.double())) < 1e-3


def test_fp8_gemm_strided_d_writes_only_its_view():
    m, n, k = 5, 160, 256
    x, w = _inputs(m, n, k, seed=1)
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(w)
    big = torch.full((m, 2 * n), 7.0, device="cuda")
    d = big[:, 1::2]  # row stride 2n, column stride 2
    c = torch.randn(n, m, device="cuda").T  # column-major c
    dg.fp8_gemm_nt(_cuda(a), _cuda(b), d, c=c)
    ref = dequant_per_token(*a) @ dequant_per_block(*b).T + c.cpu().double()
    assert dg.calc_diff(d.cpu(), ref) < EXACT[torch.float32]
    assert bool((big[:, 0::2] == 7.0).all()), "wrote outside the strided view of d"


def test_fp8_gemm_k_zero_and_empty():
    a0, b0 = dg.per_token_cast_to_fp8(torch.zeros(2, 0)), dg.per_block_cast_to_fp8(torch.zeros(3, 0))
    c = torch.randn(2, 3, device="cuda")
    d = torch.empty(2, 3, device="cuda")
    dg.fp8_gemm_nt(_cuda(a0), _cuda(b0), d, c=c)
    assert torch.equal(d, c)
    x, w = _inputs(0, 130, 256, seed=2)
    d0 = torch.empty(0, 130, device="cuda")
    dg.fp8_gemm_nt(_cuda(dg.per_token_cast_to_fp8(x)), _cuda(dg.per_block_cast_to_fp8(w)), d0)  # M = 0: no launch


def test_bf16_gemm_matches_reference():
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(5, 300, generator=g).bfloat16(), torch.randn(140, 300, generator=g).bfloat16()
    c = torch.randn(5, 140, generator=g)
    for d_dtype in (torch.float32, torch.bfloat16):
        d = torch.empty(5, 140, dtype=d_dtype, device="cuda")
        dg.bf16_gemm_nt(a.cuda(), b.cuda(), d, c.cuda())
        assert dg.calc_diff(d.cpu(), a.double() @ b.double().T + c.double()) < EXACT[d_dtype]


def test_gemm_on_a_side_stream():
    x, w = _inputs(8, 256, 512, seed=4)
    a, b = _cuda(dg.per_token_cast_to_fp8(x)), _cuda(dg.per_block_cast_to_fp8(w))
    big = torch.randn(4096, 4096, device="cuda")
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        d = (big @ big)[:8, :256] * 0.0  # d is written by a long matmul queued first on `side`
        dg.fp8_gemm_nt(a, b, d, c=d.clone())  # c = 0 from the same stream
    side.synchronize()
    assert (
        dg.calc_diff(d.cpu(), dequant_per_token(*[t.cpu() for t in a]) @ dequant_per_block(*[t.cpu() for t in b]).T)
        < EXACT[torch.float32]
    )


CAST_INPUTS = [
    ("bf16", lambda g: torch.randn(37, 300, generator=g).bfloat16()),
    ("fp32", lambda g: torch.randn(130, 260, generator=g) * 10),
    ("wide", lambda g: torch.randn(3, 1000, generator=g) * torch.logspace(-6, 3, 1000)),  # scales of every size
    ("transposed", lambda g: torch.randn(200, 40, generator=g).T),  # column-major x: any strides
]


def _check_cast_equal(cuda_pair, cpu_pair) -> None:
    q, sf = cuda_pair
    assert q.is_cuda and sf.is_cuda and q.dtype == FP8 and sf.dtype == torch.float32
    assert torch.equal(q.cpu().view(torch.uint8), cpu_pair[0].view(torch.uint8)), "e4m3 bytes differ from the CPU cast"
    assert torch.equal(sf.cpu(), cpu_pair[1]), "scales differ from the CPU cast"


@pytest.mark.parametrize("name,make", CAST_INPUTS, ids=[c[0] for c in CAST_INPUTS])
@pytest.mark.parametrize("use_ue8m0", [False, True])
@pytest.mark.parametrize("gran_k", [128, 32, 200])
def test_per_token_cast_equals_cpu_bytes(name, make, use_ue8m0, gran_k):
    x = make(torch.Generator().manual_seed(5))
    _check_cast_equal(
        dg.per_token_cast_to_fp8(x.cuda(), use_ue8m0, gran_k), dg.per_token_cast_to_fp8(x, use_ue8m0, gran_k)
    )


@pytest.mark.parametrize("name,make", CAST_INPUTS, ids=[c[0] for c in CAST_INPUTS])
@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_per_block_cast_equals_cpu_bytes(name, make, use_ue8m0):
    x = make(torch.Generator().manual_seed(6))
    _check_cast_equal(dg.per_block_cast_to_fp8(x.cuda(), use_ue8m0), dg.per_block_cast_to_fp8(x, use_ue8m0))


def test_casts_against_float64():
    # each group's scale is amax / 448 (float32 division), UE8M0 the smallest power of two at or above it;
    # every value within half a step of its group's e4m3 grid
    x = torch.randn(6, 300) * torch.logspace(-3, 2, 300)
    x[1, 5], x[2, :128] = float("nan"), 0.0
    q, sf = (t.cpu() for t in dg.per_token_cast_to_fp8(x.cuda()))
    amax = torch.nn.functional.pad(x.abs(), (0, 84)).view(6, 3, 128).nan_to_num(0).amax(-1).clamp(min=1e-4)
    assert torch.equal(sf, amax / 448)
    assert bool(q[1, 5].float().isnan()) and int(q.float().isnan().sum()) == 1
    _, sf8 = dg.per_token_cast_to_fp8(x.cuda(), use_ue8m0=True)
    assert torch.equal(sf8.cpu().double(), torch.exp2(torch.ceil(torch.log2((amax / 448).double()))))
    back, x64 = dequant_per_token(q, sf), x.double()
    ok = ~x64.isnan()
    step = sf.double().repeat_interleave(128, 1)[:, :300]
    assert bool(((back - x64).abs() <= x64.abs() * 2**-4 + step * 2**-9)[ok].all())


def test_casts_empty_and_partial():
    for shape in [(0, 300), (5, 0), (1, 1)]:
        x = torch.randn(*shape)
        _check_cast_equal(dg.per_token_cast_to_fp8(x.cuda()), dg.per_token_cast_to_fp8(x))
        _check_cast_equal(dg.per_block_cast_to_fp8(x.cuda()), dg.per_block_cast_to_fp8(x))


def test_mixed_devices_refused():
    x, w = _inputs(2, 130, 256, seed=7)
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(w)
    d = torch.empty(2, 130, device="cuda")
    with pytest.raises(RuntimeError, match=r"keel_deep_gemm::fp8_gemm_nt: sfa must be a CUDA tensor, got cpu"):
        dg.fp8_gemm_nt((a[0].cuda(), a[1]), _cuda(b), d)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_devices_refused():
    x, w = _inputs(2, 130, 256, seed=8)
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(w)
    d = torch.empty(2, 130, device="cuda:0")
    with pytest.raises(RuntimeError, match=r"keel_deep_gemm::fp8_gemm_nt: b must be on the device of a"):
        dg.fp8_gemm_nt(_cuda(a), (b[0].to("cuda:1"), b[1].cuda()), d)
