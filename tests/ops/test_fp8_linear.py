"""keel::fp8_linear (weight-only FP8 GEMV on the CPU) against the fp64 product of x and the dequantized weight.

Each ISA level runs in a child process (KEEL_CPU_ISA=base, avx2, auto): the baseline table decode, the AVX2
F16C decode, and on an AVX-512 CPU the fp16 decode (fp32/fp16 x) and the AVX512-BF16 vdpbf16ps path (bf16 x),
whose blocks with e4m3 subnormals or NaN bytes go through the exact decode (zero bytes stay on the bf16 path) and
whose x is scaled per row by a power of two (tiny and huge rows included). Every level must round the fp32 sum once into the output dtype.
"""

from __future__ import annotations

import os

import pytest
import torch
from keel_dev.forked import run_python
from support.devices import assert_rounded_like

from keel import ops
from keel.vendored import deep_gemm as dg

# Shared with the child processes: quantize, dequantize, reference, check.
HELPERS = r"""
import torch
from keel import ops
from keel.vendored import deep_gemm as dg

def quantize(w, block=False):
    q, s = (dg.per_block_cast_to_fp8 if block else dg.per_token_cast_to_fp8)(w.float().contiguous())
    return q, s

def dequant(q, s):
    n, k = q.shape
    rows = 1 if s.shape[0] == n else 128
    full = s.double().repeat_interleave(rows, 0)[:n].repeat_interleave(128, 1)[:, :k]
    return q.double() * full

def reference(x, q, s, bias):
    out = x.double() @ dequant(q, s).T
    return out if bias is None else out + bias.double()

def close(out, x, q, s, bias):
    want = reference(x, q, s, bias)
    assert out.shape == want.shape and out.dtype == x.dtype, (out.shape, out.dtype)
    tol = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}[x.dtype]
    scale = x.double().abs() @ dequant(q, s).abs().T + 1e-30  # the sum of |terms|: fp32 error is relative to it
    err = ((out.double() - want).abs() / scale).nan_to_num(0.0)
    assert float(err.max()) <= tol, f"{x.dtype} {tuple(x.shape)} x {tuple(q.shape)}: error {float(err.max())}"
    return want

def special_weight(n, k, seed):
    # e4m3 bytes with subnormals (0x01-0x07, 0x81-0x87), zeros and plain values, sprinkled over blocks
    g = torch.Generator().manual_seed(seed)
    b = torch.randint(0x08, 0x77, (n, k), generator=g, dtype=torch.uint8)
    b |= (torch.rand(n, k, generator=g) < 0.5).to(torch.uint8) << 7
    sub = torch.rand(n, k, generator=g) < 0.01
    b[sub] = torch.randint(1, 8, (int(sub.sum()),), generator=g, dtype=torch.uint8) | (b[sub] & 0x80)
    b[torch.rand(n, k, generator=g) < 0.005] = 0
    b[: n // 2, :] = torch.randint(1, 8, (n // 2, k), generator=g, dtype=torch.uint8)  # rows of subnormals only
    q = b.view(torch.float8_e4m3fn)
    s = torch.rand(n, (k + 127) // 128, generator=g) + 0.5
    return q, s

def run_checks():
    torch.manual_seed(0)
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        for m, k, n in [(1, 576, 96), (3, 300, 40), (33, 129, 17), (2, 64, 7)]:
            for block in (False, True):
                x = torch.randn(m, k).to(dt)
                q, s = quantize(torch.randn(n, k), block)
                bias = torch.randn(n).to(dt)
                close(ops.fp8_linear(x, q, s, bias), x, q, s, bias)
        q, s = special_weight(24, 300, 1)
        x = torch.randn(2, 300).to(dt)
        close(ops.fp8_linear(x, q, s, None), x, q, s, None)
    return "ok"
"""
_H: dict = {}
exec(HELPERS, _H)  # the same helpers in this process
quantize, reference, close, special_weight = _H["quantize"], _H["reference"], _H["close"], _H["special_weight"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 2, 5, 32, 40])
@pytest.mark.parametrize("k, n", [(576, 960), (1536, 64), (300, 260), (64, 7), (129, 5), (1, 3)], ids=str)
@pytest.mark.parametrize("block", [False, True], ids=["row-scales", "128x128-scales"])
def test_matches_reference(dtype, m, k, n, block):
    g = torch.Generator().manual_seed(m * 1000 + k + n)
    x = torch.randn(m, k, generator=g).to(dtype)
    q, s = quantize(torch.randn(n, k, generator=g), block)
    bias = torch.randn(n, generator=g).to(dtype) if n % 2 == 0 else None
    out = ops.fp8_linear(x, q, s, bias)
    want = close(out, x, q, s, bias)
    if dtype != torch.float32:  # one rounding of the fp32 sum
        assert_rounded_like(out, want.to(dtype), dtype, max_ulps=None)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [1, 3])  # 1: the decode kernel's whole-row test and exact second pass
def test_subnormal_and_zero_bytes_are_exact(dtype, m):
    q, s = special_weight(40, 576, 2)
    x = torch.randn(m, 576).to(dtype)
    close(ops.fp8_linear(x, q, s, None), x, q, s, None)
    # the all-subnormal rows would be zeros if vdpbf16ps read them (bf16 subnormals are zero to it)
    assert bool((ops.fp8_linear(x, q, s, None)[:, :20] != 0).all())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("m", [1, 2])
def test_nan_byte_makes_its_row_nan(dtype, m):
    q, s = quantize(torch.randn(16, 300))
    b = q.view(torch.uint8).clone()
    b[3, 170] = 0x7F  # e4m3fn NaN (S.1111.111), in the partial last block
    b[9, 5] = 0xFF
    q = b.view(torch.float8_e4m3fn)
    out = ops.fp8_linear(torch.randn(m, 300).to(dtype), q, s, None)
    assert torch.equal(out.isnan().any(0), torch.tensor([i in (3, 9) for i in range(16)]))
    assert bool(out[:, [3, 9]].isnan().all())


def test_tiny_huge_and_nonfinite_rows():
    q, s = quantize(torch.randn(50, 576))
    x = torch.randn(6, 576)
    x[1] *= 1e-30  # the bf16 path scales each row by its own power of two
    x[2] *= 1e30
    x[4] *= 3e22  # past 2^72: the bf16 path's factors would overflow (it gave inf), so the exact path
    x[5] *= 2e21  # just below: the bf16 path, its factor 2^127
    xb = x.bfloat16()
    close(ops.fp8_linear(xb, q, s, None), xb, q, s, None)
    for i in range(6):  # and the same alone (each row's path is its own)
        close(ops.fp8_linear(xb[i : i + 1], q, s, None), xb[i : i + 1], q, s, None)
    xb[3, 7] = float("inf")  # a non-finite x: inf/nan as the exact arithmetic gives them
    out = ops.fp8_linear(xb, q, s, None).float()
    want = reference(xb, q, s, None)
    assert torch.equal(out[3].isnan(), want[3].isnan()) and torch.equal(out[3].isinf(), want[3].isinf())


@pytest.mark.parametrize("k", [576, 300, 64])
def test_outputs_do_not_depend_on_how_rows_are_split(k):
    # decode takes weight rows in groups (4 at a time, the rest alone, the last rows with a masked tail) and
    # threads split the rows anywhere: each output must be the same bits whichever rows share its pass
    g = torch.Generator().manual_seed(k)
    q, s = quantize(torch.randn(203, k, generator=g))
    x = torch.randn(1, k, generator=g).bfloat16()
    full = ops.fp8_linear(x, q, s, None)
    for lo, hi in [(1, 203), (2, 200), (3, 7), (198, 203), (101, 102)]:
        assert torch.equal(ops.fp8_linear(x, q[lo:hi], s[lo:hi], None), full[:, lo:hi]), (lo, hi)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.fp8_linear(x, q, s, None)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, full)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rows_do_not_depend_on_the_batch(dtype):
    # the same x row gives the same bits alone, in a decode call (1-4 rows) and in a 45-row call (a
    # second 32-row pass), on the GEMV and on AMX alike (bf16 on an AMX CPU runs every call there); every row
    # count at every level: tests/ops/test_row_independence.py
    q, s = quantize(torch.randn(70, 576))
    x = torch.randn(45, 576).to(dtype)
    full = ops.fp8_linear(x, q, s, None)
    for i in (0, 7, 40):
        one = ops.fp8_linear(x[i : i + 1], q, s, None)
        assert torch.equal(ops.fp8_linear(x[i : i + 3], q, s, None)[:1], one)
        assert torch.equal(ops.fp8_linear(x[i : i + 5], q, s, None)[:1], full[i : i + 1])
        assert torch.equal(one, full[i : i + 1])


@pytest.mark.parametrize("k", [576, 300])
def test_rows_with_zero_subnormal_or_nan_bytes_do_not_depend_on_the_batch(k):
    # the decode kernel marks rows holding a zero, subnormal or NaN byte, scans the marked ones again and
    # computes only those with a subnormal or NaN byte again: each row must get the bits of the multi-row path,
    # which decides per block; rows of zeros and plain bytes, of subnormals, of both, with a NaN, and rows whose
    # special byte sits right after k (the next row's first byte, read by the unmasked tail)
    g = torch.Generator().manual_seed(k)
    q, s = quantize(torch.randn(64, k, generator=g))
    b = q.view(torch.uint8).clone()
    b[0:16, 5] = 0
    b[8:16, 1] = 0x80  # -0
    b[16:24, 9] = 0x03  # a subnormal
    b[24:32, 2] = 0
    b[24:32, k - 1] = 0x85  # a zero and a subnormal in the last (partial) block
    b[32, 100] = 0x7F  # NaN
    b[40:48, 0] = 0x02  # rows 39..46 end right before a subnormal byte
    q = b.view(torch.float8_e4m3fn)
    x = torch.randn(19, k, generator=g).bfloat16()  # 5 rows: one weight row per pass; 19 (>= 16): two per pass
    rows = ops.fp8_linear(x, q, s, None)
    close(rows, x, q, s, None)
    assert bool(rows[:, 32].isnan().all()) and not bool(rows[:, 33:].isnan().any())
    assert torch.equal(ops.fp8_linear(x[:5], q, s, None).view(torch.int16), rows[:5].view(torch.int16))
    for i in range(19):  # the same bits (NaN's included: int16 views)
        one = ops.fp8_linear(x[i : i + 1], q, s, None)
        assert torch.equal(one.view(torch.int16), rows[i : i + 1].view(torch.int16)), i


def special_reference(q):
    """Rows of q holding an e4m3 subnormal or NaN byte, by torch's own e4m3 decode."""
    v = q.float()
    return (v.isnan() | ((v != 0) & (v.abs() < 2.0**-6))).any(1)


def test_special_rows_marks_every_subnormal_or_nan_byte():
    # each of the 256 bytes alone in a row of plain bytes (also strided); the reference is torch's own e4m3 decode
    b = torch.full((256, 300), 0x38, dtype=torch.uint8)  # 1.0
    b[torch.arange(256), torch.arange(256)] = torch.arange(256, dtype=torch.uint8)
    q = b.view(torch.float8_e4m3fn)
    v = q.float()
    want = special_reference(q)
    assert int(want.sum()) == 2 * 7 + 2  # the subnormals 0x01-0x07, 0x81-0x87, and the NaNs 0x7F, 0xFF
    assert torch.equal(ops.fp8_special_rows(q), want)
    tail = torch.full((256, 300), 0x38, dtype=torch.uint8)  # in the last 4 bytes (past the 8-byte steps)
    tail[torch.arange(256), 299 - torch.arange(256) % 4] = torch.arange(256, dtype=torch.uint8)
    assert torch.equal(ops.fp8_special_rows(tail.view(torch.float8_e4m3fn)), want)
    wide = torch.full((256, 600), 0x38, dtype=torch.uint8)
    wide[:, ::2] = b
    assert torch.equal(ops.fp8_special_rows(wide.view(torch.float8_e4m3fn)[:, ::2]), want)
    assert ops.fp8_special_rows(q[:0]).shape == (0,)
    with pytest.raises(RuntimeError, match=r"keel::fp8_special_rows: qweight must be float8_e4m3fn, got float32"):
        ops.fp8_special_rows(v)
    with pytest.raises(RuntimeError, match=r"keel::fp8_special_rows: qweight must be \[N, K\], got \[300\]"):
        ops.fp8_special_rows(q[0])


@pytest.mark.parametrize("k", [576, 300])
def test_special_rows_from_load_give_the_scans_bits(k):
    # the one-row GEMV given fp8_special_rows skips its scan: rows with subnormal or NaN bytes must still take the
    # exact pass (their bits, NaN included), the others the fast one, as without them
    g = torch.Generator().manual_seed(k + 1)
    q, s = quantize(torch.randn(64, k, generator=g))
    b = q.view(torch.uint8).clone()
    b[0:8, 5] = 0  # zeros: fast
    b[16:24, 9] = 0x03  # subnormals: exact
    b[24:32, k - 1] = 0x85
    b[32, 100] = 0x7F  # NaN
    q = b.view(torch.float8_e4m3fn)
    special = ops.fp8_special_rows(q)
    assert torch.equal(special, special_reference(q))
    assert bool(special[16:33].all())
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(1, k, generator=g).to(dtype)
        want = ops.fp8_linear(x, q, s, None)
        got = ops.fp8_linear(x, q, s, None, special)
        ints = torch.int16 if dtype == torch.bfloat16 else torch.int32
        assert torch.equal(got.view(ints), want.view(ints))
        assert bool(got[0, 32].isnan()) and not bool(got[0, 33:].isnan().any())
        close(got, x, q, s, None)


def test_strided_and_3d_inputs():
    q, s = quantize(torch.randn(45, 70))
    x = torch.randn(5, 3, 140).bfloat16()[..., ::2].transpose(0, 1)
    bias = torch.randn(90).bfloat16()[::2]
    out = ops.fp8_linear(x, q, s, bias)
    assert out.shape == (3, 5, 45) and out.is_contiguous()
    close(out.reshape(15, 45), x.reshape(15, 70), q, s, bias)
    assert ops.fp8_linear(torch.randn(0, 70), q, s, None).shape == (0, 45)


# "auto" in the quick tier; the forced lower builds (a child process each) only in the whole suite
@pytest.mark.parametrize(
    "isa", [pytest.param("base", marks=pytest.mark.slow), pytest.param("avx2", marks=pytest.mark.slow), "auto"]
)
def test_cpu_isa_paths(isa, tmp_path):
    # each build in a fresh process (the ISA is chosen once); outside the checkout, so the wheel is imported
    code = HELPERS + "\nprint(run_checks())\n"
    env = {**os.environ, "KEEL_CPU_ISA": isa}
    out = run_python(code, env=env, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


def test_fp8_linear_layer_uses_the_kernel_on_cpu():
    from torch import nn

    from keel.layers.fp8_linear import Fp8Linear

    lin = nn.Linear(300, 70).bfloat16()
    layer = Fp8Linear(lin)
    x = torch.randn(2, 3, 300).bfloat16()
    got = layer(x)
    assert torch.equal(got, ops.fp8_linear(x, layer.qweight, layer.weight_scale, lin.bias))
    assert layer.special_rows is not None and torch.equal(layer.special_rows, ops.fp8_special_rows(layer.qweight))
    assert "special_rows" not in layer.state_dict()  # derived at load, not saved
    x1 = x[0, :1]
    want = (layer.qweight, layer.weight_scale, lin.bias, layer.special_rows)  # what the fused layer ops take
    assert all(a is b for a, b in zip(layer.op_weights(), want, strict=True))
    # new bytes through load_state_dict: the special rows are found again
    state = layer.state_dict()
    b = state["qweight"].view(torch.uint8).clone()
    b[:, 0] = 0x7F
    layer.load_state_dict({**state, "qweight": b.view(torch.float8_e4m3fn)})
    assert bool(layer.special_rows.all()) and bool(layer(x1).isnan().all())
    assert dg.calc_diff(got, nn.functional.linear(x.double(), lin.weight.double(), lin.bias.double())) < 1e-3


def test_opcheck():
    q, s = quantize(torch.randn(8, 16))
    # (opcheck's schema test runs aten ops that have no float8 CPU kernel, so the fake and autograd checks)
    utils = ("test_faketensor", "test_autograd_registration")
    op = torch.ops.keel.fp8_linear.default
    torch.library.opcheck(op, (torch.randn(4, 16), q, s, torch.randn(8)), test_utils=utils)
    torch.library.opcheck(op, (torch.randn(2, 3, 16).bfloat16(), q, s, None), test_utils=utils)
    torch.library.opcheck(op, (torch.randn(1, 16).bfloat16(), q, s, None, ops.fp8_special_rows(q)), test_utils=utils)
    torch.library.opcheck(torch.ops.keel.fp8_special_rows.default, (q,), test_utils=utils)


def _q(n=8, k=16):
    return quantize(torch.randn(n, k))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda q, s: (torch.randn(2, 12), q, s, None), r"keel::fp8_linear: qweight must be \[N, 12\] to match"),
        (lambda q, s: (torch.randn(2, 16), q.float(), s, None), r"keel::fp8_linear: qweight must be float8_e4m3fn"),
        (lambda q, s: (torch.randn(2, 16), q, s.double(), None), r"keel::fp8_linear: scale must be float32"),
        (
            lambda q, s: (torch.randn(2, 16), q, torch.ones(8, 2), None),
            r"keel::fp8_linear: scale must be \[8, 1\] \(per row\) or \[1, 1\] \(per 128 rows\)",
        ),
        (lambda q, s: (torch.randn(2, 16), q, s, torch.randn(7)), r"keel::fp8_linear: bias must be \[8\]"),
        (
            lambda q, s: (torch.randn(2, 16), q, s, torch.randn(8).bfloat16()),
            r"keel::fp8_linear: bias must have the dtype of x",
        ),
        (lambda q, s: (torch.ones(2, 16, dtype=torch.int32), q, s, None), r"keel::fp8_linear: x must be float32"),
        (
            lambda q, s: (torch.randn(1, 16), q, s, None, torch.zeros(8, dtype=torch.uint8)),
            r"keel::fp8_linear: special_rows must be bool, got uint8",
        ),
        (
            lambda q, s: (torch.randn(1, 16), q, s, None, torch.zeros(7, dtype=torch.bool)),
            r"keel::fp8_linear: special_rows must be \[8\] \(one per qweight row",
        ),
        (
            lambda q, s: (torch.randn(1, 16), q, s, None, torch.zeros(8, 1, dtype=torch.bool)),
            r"keel::fp8_linear: special_rows must be \[8\]",
        ),
    ],
)
def test_bad_arguments(make, match):
    q, s = _q()
    args = make(q, s)
    with pytest.raises(RuntimeError, match=match):
        ops.fp8_linear(*args)
    meta = [a.to("meta") if a is not None else None for a in args]  # the fake (meta) checks the same
    with pytest.raises(RuntimeError, match=match):
        ops.fp8_linear(*meta)
