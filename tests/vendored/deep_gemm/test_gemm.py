"""fp8_gemm_nt / bf16_gemm_nt against fp64 references of the dequantized inputs (DeepGEMM's calc_diff
with explicit thresholds), partial 128-blocks in M, N and K, strided d, c present/absent, bad inputs."""

from __future__ import annotations

import pytest
import torch
from support.dg_reference import dequant_per_token, fp8_reference

from keel.vendored import deep_gemm as dg

FP8 = torch.float8_e4m3fn
# calc_diff thresholds: kernel vs fp64 of the same (dequantized) inputs, by output dtype; and the
# FP8 accuracy claim (DeepGEMM's 1e-3) against the unquantized inputs
EXACT = {torch.float32: 1e-9, torch.bfloat16: 2e-5}
FP8_VS_UNQUANTIZED = 1e-3
OPS = torch.ops.keel_deep_gemm


def _operands(m: int, n: int, k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g) * 0.05
    return x, w, dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(w)


@pytest.mark.parametrize("m,n,k", [(1, 256, 512), (8, 200, 300), (33, 130, 129)])
@pytest.mark.parametrize(
    "d_dtype,c_dtype", [(torch.float32, None), (torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)]
)
def test_fp8_gemm_matches_reference(m, n, k, d_dtype, c_dtype):
    x, w, (a, sfa), (b, sfb) = _operands(m, n, k, seed=m * n + k)
    c = None if c_dtype is None else torch.randn(m, n).to(c_dtype)
    d = torch.empty(m, n, dtype=d_dtype)
    dg.fp8_gemm_nt((a, sfa), (b, sfb), d, c=c)
    ref = fp8_reference(a, sfa, b, sfb, c)
    assert dg.calc_diff(d, ref) < EXACT[d_dtype]
    unquantized = x.double() @ w.double().T + (0 if c is None else c.double())
    assert dg.calc_diff(d, unquantized) < FP8_VS_UNQUANTIZED


def test_partial_blocks_use_their_own_scales():
    # only the last, partial block of M, N and K is nonzero: a kernel that drops or mis-scales
    # partial blocks fails here even though they are a tiny share of a random product
    m, n, k = 3, 131, 133
    x = torch.zeros(m, k)
    w = torch.zeros(n, k)
    x[:, 128:] = torch.randn(m, k - 128)
    w[128:, 128:] = torch.randn(n - 128, k - 128) * 3.0
    w[:128, :128] = 100.0  # a large first block whose scale must not leak into the tail
    (a, sfa), (b, sfb) = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(w)
    d = torch.empty(m, n)
    dg.fp8_gemm_nt((a, sfa), (b, sfb), d)
    ref = fp8_reference(a, sfa, b, sfb)
    torch.testing.assert_close(d.double(), ref, rtol=1e-6, atol=1e-6)
    assert ref[:, 128:].abs().max() > 0.1


def test_per_row_weight_scales_recipe_1_1_128():
    # upstream's 1D1D recipe: B scaled per row and 128-wide K group (sfb [N, ceil(K/128)])
    m, n, k = 3, 140, 260
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g)
    (a, sfa), (b, sfb) = dg.per_token_cast_to_fp8(x), dg.per_token_cast_to_fp8(w)
    d = torch.empty(m, n)
    dg.fp8_gemm_nt((a, sfa), (b, sfb), d, recipe=(1, 1, 128))
    ref = dequant_per_token(a, sfa) @ dequant_per_token(b, sfb).T
    assert dg.calc_diff(d, ref) < EXACT[torch.float32]


def test_strided_d_and_c():
    m, n, k = 4, 160, 256
    _, _, (a, sfa), (b, sfb) = _operands(m, n, k)
    big = torch.full((m, 2 * n), 7.0)
    d = big[:, 1::2]  # row stride 2n, column stride 2
    c = torch.randn(n, m).T  # column-major c
    dg.fp8_gemm_nt((a, sfa), (b, sfb), d, c=c)
    assert dg.calc_diff(d, fp8_reference(a, sfa, b, sfb, c)) < EXACT[torch.float32]
    assert bool((big[:, 0::2] == 7.0).all()), "wrote outside the strided view of d"


def test_nan_weight_byte_gives_nan_column():
    m, n, k = 2, 130, 256
    _, _, (a, sfa), (b, sfb) = _operands(m, n, k)
    raw = b.view(torch.uint8).clone()
    raw[5, 200] = 0x7F  # e4m3fn NaN
    d = torch.empty(m, n)
    dg.fp8_gemm_nt((a, sfa), (raw.view(FP8), sfb), d)
    assert bool(d[:, 5].isnan().all()) and not bool(d[:, torch.arange(n) != 5].isnan().any())


def test_recipe_and_k_zero():
    _, _, (a, sfa), (b, sfb) = _operands(2, 3, 130)
    d = torch.empty(2, 3)
    dg.fp8_gemm_nt((a, sfa), (b, sfb), d, recipe=(1, 128, 128))
    assert dg.calc_diff(d, fp8_reference(a, sfa, b, sfb)) < EXACT[torch.float32]
    a0, sfa0 = dg.per_token_cast_to_fp8(torch.zeros(2, 0))
    b0, sfb0 = dg.per_block_cast_to_fp8(torch.zeros(3, 0))
    c = torch.randn(2, 3)
    dg.fp8_gemm_nt((a0, sfa0), (b0, sfb0), d, c=c)
    assert torch.equal(d, c)


def test_bf16_gemm_matches_reference():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(5, 300, generator=g).bfloat16()
    b = torch.randn(140, 300, generator=g).bfloat16()
    c = torch.randn(5, 140, generator=g)
    for d_dtype in (torch.float32, torch.bfloat16):
        d = torch.empty(5, 140, dtype=d_dtype)
        dg.bf16_gemm_nt(a, b, d, c)
        assert dg.calc_diff(d, a.double() @ b.double().T + c.double()) < EXACT[d_dtype]


def _fp8_args(m=2, n=130, k=256):
    _, _, (a, sfa), (b, sfb) = _operands(m, n, k)
    return a, sfa, b, sfb, torch.empty(m, n)


BAD = [
    (
        lambda a, sfa, b, sfb, d: ((a.float(), sfa), (b, sfb), d),
        {},
        r"fp8_gemm_nt: a must be float8_e4m3fn, got float32",
    ),
    (lambda a, sfa, b, sfb, d: ((a, sfa[:, :1]), (b, sfb), d), {}, r"fp8_gemm_nt: sfa must be \[2, 2\], got \[2, 1\]"),
    (
        lambda a, sfa, b, sfb, d: ((a, sfa), (b, sfb.double()), d),
        {},
        r"fp8_gemm_nt: sfb must be float8_e4m3fn, bfloat16 or float32, got float64",
    ),
    (lambda a, sfa, b, sfb, d: ((a, sfa), (b, sfb[:1]), d), {}, r"fp8_gemm_nt: sfb must be \[2, 2\], got \[1, 2\]"),
    (lambda a, sfa, b, sfb, d: ((a, sfa), (b[:, :128], sfb), d), {}, r"fp8_gemm_nt: b must be \[N, 256\]"),
    (lambda a, sfa, b, sfb, d: ((a, sfa), (b, sfb), d[:, :5]), {}, r"fp8_gemm_nt: d must be \[2, 130\], got \[2, 5\]"),
    (lambda a, sfa, b, sfb, d: ((a, sfa), (b, sfb), d.half()), {}, r"fp8_gemm_nt: d must be float8_e4m3fn, bfloat16"),
    (
        lambda a, sfa, b, sfb, d: ((a, sfa), (b, sfb), d),
        {"recipe": (1, 128, 64)},
        r"fp8_gemm_nt: recipe must be \(1, 128, 128\) \(128x128-block B scales\) or \(1, 1, 128\)",
    ),
    (
        lambda a, sfa, b, sfb, d: ((a, sfa), (b, sfb), d),
        {"recipe": (1, 1, 128)},
        r"fp8_gemm_nt: sfb must be \[130, 2\], got \[2, 2\]",
    ),
    (
        lambda a, sfa, b, sfb, d: ((a, sfa), (b, sfb), d),
        {"recipe": (1, 128, 2**40)},
        r"fp8_gemm_nt: recipe_k must fit in a 32-bit int \(the vendored kernel's type\), got 1099511627776",
    ),
    (
        lambda a, sfa, b, sfb, d: ((a.T.contiguous().T, sfa), (b, sfb), d),
        {},
        r"fp8_gemm_nt: a must be K-major \(unit stride along its last dim\), got strides \[1, 2\]",
    ),
]


@pytest.mark.parametrize("make,kwargs,match", BAD)
def test_fp8_gemm_bad_inputs(make, kwargs, match):
    with pytest.raises(RuntimeError, match=r"keel_deep_gemm::" + match):
        dg.fp8_gemm_nt(*make(*_fp8_args()), **kwargs)


def test_split_recipe_must_be_complete():
    a, sfa, b, sfb, d = _fp8_args()
    with pytest.raises(
        RuntimeError, match=r"keel_deep_gemm::fp8_gemm_nt: recipe_m, recipe_n and recipe_k must be given"
    ):
        OPS.fp8_gemm_nt.default(a, sfa, b, sfb, d, None, 1, None, None, False)


def test_bf16_gemm_bad_dtype():
    with pytest.raises(RuntimeError, match=r"keel_deep_gemm::bf16_gemm_nt: b must be bfloat16, got float32"):
        dg.bf16_gemm_nt(torch.zeros(2, 8).bfloat16(), torch.zeros(3, 8), torch.empty(2, 3))


def test_opcheck_gemms():
    a, sfa, b, sfb, d = _fp8_args(m=3, n=20, k=130)
    # torch's schema checker compares inputs with a multiply that has no float8 kernel, so test_schema
    # runs on bf16_gemm_nt only (same `Tensor(a!) d` schema pattern)
    torch.library.opcheck(
        OPS.fp8_gemm_nt.default,
        (a, sfa, b, sfb, d, torch.randn(3, 20), None, None, None, False),
        test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"),
    )
    x, y = torch.randn(3, 130).bfloat16(), torch.randn(20, 130).bfloat16()
    torch.library.opcheck(OPS.bf16_gemm_nt.default, (x, y, torch.empty(3, 20), None))


def test_subnormal_weight_bytes_count():
    # e4m3 subnormals (exponent field 0) in B: every kernel build must count them exactly (vdpbf16ps alone
    # would read their bf16 images as zero)
    m, n, k = 2, 3, 256
    x = torch.randn(m, k)
    a, sfa = dg.per_token_cast_to_fp8(x)
    raw = torch.zeros(n, k, dtype=torch.uint8)
    raw[0] = 0x01  # 2^-9
    raw[1, ::2] = 0x87  # -7 * 2^-9
    raw[2] = 0x38  # 1.0, no subnormal
    b, sfb = raw.view(FP8), torch.full((1, 2), 3.0)
    d = torch.empty(m, n)
    dg.fp8_gemm_nt((a, sfa), (b, sfb), d)
    ref = fp8_reference(a, sfa, b, sfb)
    assert bool((ref[:, :2].abs() > 1e-4).all())
    torch.testing.assert_close(d.double(), ref, rtol=1e-5, atol=1e-7)
