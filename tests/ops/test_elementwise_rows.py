"""The same bits whatever the call, for the row ops beside the projections: a row's rms_norm / fused_add_rms_norm /
silu_and_mul bits do not depend on the call (how many rows it has, where the row sits), on the layout of its tensors
(contiguous or strided), or on which vector build of the kernel runs it (silu_and_mul's 16-wide AVX-512 build
against its 8-wide AVX2 build).

The norms sum a row's squares in 16 fixed lanes whatever the layout (csrc/ops/rms_norm_cpu.cpp); a strided row
summed in another order would round differently in the last bit now and then, which is what these look for.
"""

from __future__ import annotations

import os

import pytest
import torch
from keel_dev.forked import run_python
from support.layouts import make

from keel import ops
from keel._compat import _cpuinfo_flags

ROWS = 40
HIDDEN = [576, 100, 7]  # SmolLM2's, one with a 4-element tail past the 16 lanes, one shorter than the lanes


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def assert_rows_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    bad = (bits(got) != bits(want)).reshape(got.shape[0], -1).any(-1).nonzero().flatten().tolist()
    assert not bad, f"{what}: rows {bad[:8]} differ in their bits"


def wide_values(rows: int, hidden: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    # magnitudes over many octaves: sums of squares whose order shows in the last bits
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, hidden, generator=g) * torch.exp2(torch.randint(-6, 7, (rows, hidden), generator=g).float())
    return x.to(dtype)


def fused(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ops.fused_add_rms_norm(x, residual, w, 1e-5)
    return x, residual


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_norm_rows_do_not_depend_on_the_call_or_layout(dtype, hidden):
    x = wide_values(ROWS, hidden, dtype, 1)
    res = wide_values(ROWS, hidden, dtype, 2)
    w = wide_values(1, hidden, dtype, 3)[0]
    alone = torch.cat([ops.rms_norm(x[i : i + 1], w, 1e-5) for i in range(ROWS)])
    fused_alone = [fused(x[i : i + 1].clone(), res[i : i + 1].clone(), w) for i in range(ROWS)]
    fx_alone = torch.cat([a for a, _ in fused_alone])
    fr_alone = torch.cat([b for _, b in fused_alone])
    for m in (2, 7, 16, ROWS):
        assert_rows_equal(ops.rms_norm(x[:m], w, 1e-5), alone[:m], f"rms_norm, {m} rows")
        fx, fr = fused(x[:m].clone(), res[:m].clone(), w)
        assert_rows_equal(fr, fr_alone[:m], f"fused_add_rms_norm residual, {m} rows")
        assert_rows_equal(fx, fx_alone[:m], f"fused_add_rms_norm output, {m} rows")
    for layout in ("strided", "transposed"):
        xs = make((ROWS, hidden), dtype, "cpu", layout)
        xs.copy_(x)
        assert_rows_equal(ops.rms_norm(xs, w, 1e-5), alone, f"rms_norm, {layout} x")
        xs2, rs = make((ROWS, hidden), dtype, "cpu", layout), make((ROWS, hidden), dtype, "cpu", layout, seed=1)
        xs2.copy_(x)
        rs.copy_(res)
        fx, fr = fused(xs2, rs, w)
        assert_rows_equal(fr, fr_alone, f"fused_add_rms_norm residual, {layout}")
        assert_rows_equal(fx, fx_alone, f"fused_add_rms_norm output, {layout}")


CHILD = r"""
import hashlib, torch
from keel import ops
g = torch.Generator().manual_seed(0)
out = []
for dtype in (torch.bfloat16, torch.float32):
    for d in (1536, 100, 7):
        x = (torch.randn(9, 2 * d, generator=g) * 6).to(dtype)
        x[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -200.0])
        y = ops.silu_and_mul(x)
        out.append(hashlib.sha256(y.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest())
print(" ".join(out))
"""


@pytest.mark.skipif(not {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq"} <= _cpuinfo_flags(),
                    reason="needs a CPU with the AVX2 and AVX-512 builds")  # fmt: skip
def test_silu_and_mul_same_bits_8_and_16_wide(tmp_path):
    digests = {}
    for level in ("avx2", "avx512"):
        env = {**os.environ, "KEEL_CPU_ISA": level}
        done = run_python(CHILD, env=env, cwd=tmp_path, timeout=300)
        assert done.returncode == 0, f"KEEL_CPU_ISA={level}:\n{done.stdout}{done.stderr}"
        digests[level] = done.stdout.split()
    assert digests["avx2"] == digests["avx512"], f"silu_and_mul: the AVX2 and AVX-512 builds differ: {digests}"
