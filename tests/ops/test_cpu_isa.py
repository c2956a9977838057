"""CPU kernels exist in two builds (baseline x86-64 and AVX2/FMA/F16C, plus AVX-512 and AMX extras for linear
and fp8_linear): every level must round float32 -> bfloat16/float16 exactly like torch, bit for bit.

The values stored are products of two 16-bit numbers (exact in float32, 16 or 22 significant bits), so
each one needs rounding: every mantissa pair gives ties to even, halfway and sticky cases, and chosen
exponents give subnormal results, overflow to inf and NaN. An unknown KEEL_CPU_ISA is refused at import.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import keel  # noqa: F401  (loads torch.ops.keel)

SCRIPT = r"""
import torch, keel

def pairs(dt):
    # every mantissa of a 16-bit type times a set of mantissas, over exponents that reach
    # normal, subnormal, overflow and the largest finite values of the target type
    info = torch.finfo(dt)
    man_bits = 7 if dt == torch.bfloat16 else 10
    m = 1.0 + torch.arange(2 ** man_bits, dtype=torch.float64) / 2 ** man_bits          # [1, 2)
    scales = [1.0, 2.0 ** -60, 2.0 ** -70, -(2.0 ** 3), 2.0 ** 60, 2.0 ** 126]
    if dt == torch.float16:
        scales = [1.0, 2.0 ** -7, 2.0 ** -12, 2.0 ** -18, -(2.0 ** 3), 2.0 ** 7.5, 2.0 ** 15]
    a = torch.cat([m * s for s in scales])
    b = m[torch.randperm(m.numel(), generator=torch.Generator().manual_seed(0))].repeat(len(scales))
    a, b = a.to(dt), b.to(dt)
    special = torch.tensor([float('nan'), float('inf'), -float('inf'), 0.0, -0.0, info.max, info.tiny,
                            info.smallest_normal / 2 ** (man_bits), 1.0], dtype=dt)
    times = torch.tensor([0.0, 0.0, 2.0, -1.0, 1.0, 2.0, 0.5, 0.5, 1.0], dtype=dt)
    return torch.cat([a, special, special]), torch.cat([b, torch.ones_like(special), times]), a.numel()

for dt in (torch.bfloat16, torch.float16):
    a, b, grid = pairs(dt)
    exact = a.float() * b.float()                     # exact products: the kernel stores these
    assert torch.equal(exact[:grid].double(), a[:grid].double() * b[:grid].double()), "product not exact"
    want = exact.to(dt)
    need = (want.float() != exact) & ~exact.isnan()
    assert int(need.sum()) > a.numel() // 2, f"{dt}: too few values need rounding ({int(need.sum())})"
    assert bool(want.isinf().any()) and bool(((want != 0) & (want.abs() < torch.finfo(dt).smallest_normal)).any())
    for c in (0.0, -0.0):
        got = keel.ops.fused_muladd(a, b, c)          # a * b + c rounded once, in the kernel's store
        want = (exact + c).to(dt)                     # (-0.0 + 0.0 is +0.0 in both)
        nan = got.isnan() & want.isnan()
        bits_equal = got.view(torch.int16) == want.view(torch.int16)
        bad = ~(bits_equal | nan)
        assert not bool(bad.any()), (f"{dt} c={c}: {exact[bad][:6].tolist()} stored as {got[bad][:6].float().tolist()}, "
                                     f"torch gives {want[bad][:6].float().tolist()}")
print("ok")
"""


@pytest.mark.parametrize("isa", ["base", "avx2", "avx512", "auto", None])
def test_rounding_matches_torch_bit_for_bit(isa, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KEEL_CPU_ISA"}
    if isa is not None:
        env["KEEL_CPU_ISA"] = isa
    # cwd outside the checkout: `python -c` puts the working directory first on sys.path
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stdout + out.stderr


def test_unknown_isa_is_refused_at_import(tmp_path):
    env = dict(os.environ, KEEL_CPU_ISA="avx9000")
    out = subprocess.run(
        [sys.executable, "-c", "import keel"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode != 0
    assert "KEEL_CPU_ISA='avx9000'" in out.stderr and "auto, base, avx2, avx512, amx" in out.stderr, out.stderr


def test_float32_path_is_exact():
    vals = torch.tensor([0.0, -0.0, 1.0, 3.14159265, 1e-40, 3.4e38, float("inf"), float("-inf"), float("nan")])
    got = keel.ops.fused_muladd(vals, torch.ones_like(vals), -0.0)  # x * 1 + (-0.0) == x, -0.0 included
    assert torch.equal(got.view(torch.int32)[:-1], vals.view(torch.int32)[:-1]) and bool(got[-1].isnan())
