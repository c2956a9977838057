"""keel::fp8_linear's AMX GEMM (csrc/ops/fp8_linear_amx_cpu.cpp): bf16 x, any row count, on a CPU with AMX.

Each 32-row weight panel is decoded once per call to bf16 (exactly: subnormal bytes from a table, NaN bytes to
NaN) and multiplied on AMX tiles per 128-wide K block, whose fp32 sum is scaled by the block's scale and added
to the running total. Checked against the fp64 product of x and the dequantized weight with
test_fp8_linear.py's bound (relative to the sum of |terms|) and one rounding; tails in m, n and k, both scale
layouts, bias, subnormal / zero / NaN bytes, non-finite x, strided x; bits must not depend on the thread
count, the row count or the other rows of the call (decode rows run here too, one summation order per
process), and differ from the AVX-512 GEMV's (so the AMX path is what ran), while fp32 / fp16 x stay on the GEMV.
Without AMX the reference checks run the GEMV.
"""

from __future__ import annotations

import os
import subprocess

import keel_dev.cpu
import pytest
import torch
from keel_dev.forked import run_python
from support.devices import assert_rounded_like

from keel import ops
from keel.vendored import deep_gemm as dg


def _cpu_has_amx_flags() -> bool:
    return {"amx_tile", "amx_bf16", "avx512_bf16"} <= keel_dev.cpu.flags()


HAS_AMX = _cpu_has_amx_flags()
needs_amx = pytest.mark.skipif(not HAS_AMX, reason="needs a CPU with AMX (amx_tile, amx_bf16)")


def quantize(w: torch.Tensor, block: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return (dg.per_block_cast_to_fp8 if block else dg.per_token_cast_to_fp8)(w.float().contiguous())


def dequant(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    n, k = q.shape
    rows = 1 if s.shape[0] == n else 128
    return q.double() * s.double().repeat_interleave(rows, 0)[:n].repeat_interleave(128, 1)[:, :k]


def reference(x, q, s, bias):
    out = x.double() @ dequant(q, s).T
    return out if bias is None else out + bias.double()


def close(out, x, q, s, bias):
    # test_fp8_linear.py's bound: bf16 x, fp32 sums, error relative to the sum of |terms| (the bias included:
    # the output's one rounding is relative to it too)
    want = reference(x, q, s, bias)
    assert out.shape == want.shape and out.dtype == x.dtype
    scale = x.double().abs() @ dequant(q, s).abs().T + 1e-30
    if bias is not None:
        scale = scale + bias.double().abs()
    err = ((out.double() - want).abs() / scale).nan_to_num(0.0)
    assert float(err.max()) <= 8e-3, f"{tuple(x.shape)} x {tuple(q.shape)}: error {float(err.max())}"
    return want


def _x(m: int, k: int, seed: int) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).bfloat16()


@pytest.mark.parametrize("m", [1, 2, 4, 5, 16, 17, 33, 70])
@pytest.mark.parametrize("k, n", [(1, 3), (127, 7), (128, 33), (129, 96), (300, 40), (576, 960)], ids=str)
@pytest.mark.parametrize("block", [False, True], ids=["row-scales", "128x128-scales"])
def test_matches_reference(m, k, n, block):
    g = torch.Generator().manual_seed(m * 1000 + k + n)
    x = torch.randn(m, k, generator=g).bfloat16()
    q, s = quantize(torch.randn(n, k, generator=g), block)
    bias = torch.randn(n, generator=g).bfloat16() if n % 3 == 0 else None
    out = ops.fp8_linear(x, q, s, bias)
    want = close(out, x, q, s, bias)
    assert_rounded_like(out, want.to(torch.bfloat16), torch.bfloat16, max_ulps=None)


def special_weight(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    # subnormal bytes (0x01-0x07, 0x81-0x87), zeros and plain values; the first half of the rows subnormal only
    g = torch.Generator().manual_seed(seed)
    b = torch.randint(0x08, 0x77, (n, k), generator=g, dtype=torch.uint8)
    b |= (torch.rand(n, k, generator=g) < 0.5).to(torch.uint8) << 7
    sub = torch.rand(n, k, generator=g) < 0.01
    b[sub] = torch.randint(1, 8, (int(sub.sum()),), generator=g, dtype=torch.uint8) | (b[sub] & 0x80)
    b[torch.rand(n, k, generator=g) < 0.005] = 0
    b[: n // 2, :] = torch.randint(1, 8, (n // 2, k), generator=g, dtype=torch.uint8) | (b[: n // 2, :] & 0x80)
    return b.view(torch.float8_e4m3fn), torch.rand(n, (k + 127) // 128, generator=g) + 0.5


def test_subnormal_and_zero_bytes_are_exact():
    q, s = special_weight(40, 576, 2)
    x = _x(20, 576, 3)
    out = ops.fp8_linear(x, q, s, None)
    close(out, x, q, s, None)
    assert bool((out[:, :20] != 0).all())  # the all-subnormal rows: bf16 normals after the decode, not zeros


def test_nan_byte_makes_its_row_nan():
    q, s = quantize(torch.randn(40, 300))
    b = q.view(torch.uint8).clone()
    b[3, 170] = 0x7F  # e4m3fn NaN (S.1111.111), in the partial last block
    b[9, 5] = 0xFF
    b[35, 299] = 0x7F  # the last byte of a row in the second 32-row panel
    out = ops.fp8_linear(_x(20, 300, 4), b.view(torch.float8_e4m3fn), s, None)
    rows = torch.tensor([i in (3, 9, 35) for i in range(40)])
    assert torch.equal(out.isnan().any(0), rows) and bool(out[:, rows].isnan().all())


def test_nonfinite_x():
    q, s = quantize(torch.randn(50, 576))
    x = _x(12, 576, 5)
    x[1, 7] = float("inf")
    x[2, 100] = -float("inf")
    x[3, 300] = float("nan")
    bias = torch.randn(50).bfloat16()
    bias[10] = float("nan")
    out = ops.fp8_linear(x, q, s, bias).double()
    want = reference(x, q, s, bias)
    assert torch.equal(out.isnan(), want.isnan()) and torch.equal(out.isinf(), want.isinf())
    assert torch.equal(out[out.isinf()], want[want.isinf()])
    keep = torch.ones(12, dtype=torch.bool)
    keep[1:4] = False
    close(ops.fp8_linear(x[keep], q, s, None), x[keep], q, s, None)


def test_strided_and_3d_x():
    q, s = quantize(torch.randn(45, 70))
    x = torch.randn(5, 3, 140).bfloat16()[..., ::2].transpose(0, 1)  # 15 rows, strided
    bias = torch.randn(90).bfloat16()[::2]
    out = ops.fp8_linear(x, q, s, bias)
    assert out.shape == (3, 5, 45) and out.is_contiguous()
    close(out.reshape(15, 45), x.reshape(15, 70), q, s, bias)


def test_thread_count_does_not_change_bits():
    before = torch.get_num_threads()
    try:
        for m, k, n in ((70, 576, 960), (17, 300, 100)):
            x = _x(m, k, 6)
            q, s = quantize(torch.randn(n, k))
            b = torch.randn(n).bfloat16()
            torch.set_num_threads(1)
            one = ops.fp8_linear(x, q, s, b)
            torch.set_num_threads(2)
            two = ops.fp8_linear(x, q, s, b)
            assert torch.equal(one.view(torch.int16), two.view(torch.int16)), (m, k, n)
    finally:
        torch.set_num_threads(before)


def test_rows_do_not_depend_on_the_other_rows_of_the_call():
    q, s = quantize(torch.randn(100, 576))
    x = _x(70, 576, 7)
    full = ops.fp8_linear(x, q, s, None)
    for a, b in ((0, 1), (7, 8), (3, 5), (9, 12), (0, 5), (3, 40), (31, 70), (60, 70)):
        assert torch.equal(ops.fp8_linear(x[a:b], q, s, None), full[a:b]), (a, b)


LEVEL_SCRIPT = r"""
import hashlib, torch
from keel import ops
from keel.vendored import deep_gemm as dg
torch.manual_seed(0)
def digest(*ts):
    h = hashlib.sha256()
    for t in ts:
        h.update(t.view(torch.int16).numpy().tobytes() if t.dtype != torch.float32 else t.numpy().tobytes())
    return h.hexdigest()[:16]
# e4m3 x bf16 products are exact and short (12 bits), so two summation orders round differently in few
# outputs: 61440 of them show it (7 differ between the AMX and AVX-512 orders with these seeds)
q, s = dg.per_token_cast_to_fp8(torch.randn(960, 1536))
x = torch.randn(64, 1536)
prompt = ops.fp8_linear(x.bfloat16(), q, s, None)
want = x.bfloat16().double() @ (q.double() * s.double().repeat_interleave(128, 1)).T
err = ((prompt.double() - want).abs() / (x.bfloat16().double().abs() @ (q.double() * s.double().repeat_interleave(128, 1)).abs().T)).max()
assert float(err) <= 8e-3, float(err)
few = ops.fp8_linear(x[:4].bfloat16(), q, s, None)
other = (ops.fp8_linear(x, q, s, None), ops.fp8_linear(x.half(), q, s, None))
print("ok", digest(few), digest(*other), digest(prompt))
"""
LEVELS = ["amx", "avx512", "auto"]


def _child(isa: str, where) -> subprocess.CompletedProcess:
    env = {**os.environ, "KEEL_CPU_ISA": isa}
    return run_python(LEVEL_SCRIPT, env=env, cwd=where, timeout=300)


@pytest.fixture(scope="module")
def levels(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    where = tmp_path_factory.mktemp("levels")
    return {isa: _child(isa, where) for isa in LEVELS if isa != "amx" or HAS_AMX}


@pytest.mark.slow  # a child process per CPU build level
@pytest.mark.parametrize("isa", LEVELS)
def test_every_level_matches_reference(isa, levels):
    if isa not in levels:
        pytest.skip("needs a CPU with AMX")
    out = levels[isa]
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stdout + out.stderr


@needs_amx
def test_amx_is_what_runs(levels):
    # auto = amx; fp32 / fp16 x stay on the GEMV (same bits as avx512); bf16 prompts do not (the 4-row call runs
    # on AMX too, but its few outputs may round alike in both orders: not compared)
    got = {isa: out.stdout.split() for isa, out in levels.items()}
    assert all(v and v[0] == "ok" for v in got.values()), {k: v.stdout + v.stderr for k, v in levels.items()}
    assert got["amx"] == got["auto"]
    assert got["amx"][2] == got["avx512"][2]
    assert got["amx"][3] != got["avx512"][3]
