"""CPU kernels exist in two builds (baseline x86-64 and AVX2/FMA/F16C, plus AVX-512 and AMX extras for linear
and fp8_linear): every level must round float32 -> bfloat16/float16 exactly like torch, bit for bit.

The values stored are products of two 16-bit numbers (exact in float32, 16 or 22 significant bits), so
each one needs rounding: every mantissa pair gives ties to even, halfway and sticky cases, and chosen
exponents give subnormal results, overflow to inf and NaN. An unknown KEEL_CPU_ISA is refused at import.

KEEL_CPU_ISA is read in one place per language (src/keel/_settings.py, csrc/stable/cpu_isa_level.h) and each
level means the same build in every library (the table in docs/ops.md): keel's ops and the vendored
flash_attn and deep_gemm are checked here level by level, and an unknown value is refused by each library
loaded on its own, without keel's Python package.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import keel_dev.cpu
import pytest
import torch
from keel_dev.forked import run_python

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
    out = run_python(SCRIPT, env=env, timeout=120, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stdout + out.stderr


def test_unknown_isa_is_refused_at_import(tmp_path):
    env = dict(os.environ, KEEL_CPU_ISA="avx9000")
    out = run_python("import keel", env=env, timeout=120, cwd=tmp_path)  # the child imports keel itself
    assert out.returncode != 0
    assert "KEEL_CPU_ISA='avx9000'" in out.stderr and "auto, base, avx2, avx512, amx" in out.stderr, out.stderr


def test_float32_path_is_exact():
    vals = torch.tensor([0.0, -0.0, 1.0, 3.14159265, 1e-40, 3.4e38, float("inf"), float("-inf"), float("nan")])
    got = keel.ops.fused_muladd(vals, torch.ones_like(vals), -0.0)  # x * 1 + (-0.0) == x, -0.0 included
    assert torch.equal(got.view(torch.int32)[:-1], vals.view(torch.int32)[:-1]) and bool(got[-1].isnan())


ROOT = Path(__file__).resolve().parents[2]
AVX2 = {"avx2", "fma", "f16c"}
AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
LEVELS = [None, "auto", "base", "avx2", "avx512", "amx"]  # None: unset


def _flags() -> set[str]:
    return keel_dev.cpu.flags()


def expected_builds(level: str | None, flags: set[str]) -> tuple[str, str]:
    """The table of docs/ops.md, worked out here from the CPU's flags: (keel's ops, a vendored fork's build)."""
    cap = {"base": 0, "avx2": 1, "avx512": 2}.get(level or "auto", 3)  # amx, auto: no cap below AMX
    keel_avx2 = cap >= 1 and AVX2 <= flags
    keel_512, keel_bf16 = keel_avx2 and cap >= 2 and AVX512 <= flags, keel_avx2 and cap >= 2 and "avx512_bf16" in flags
    if not keel_avx2:
        keel = "base"
    elif keel_512 and keel_bf16:
        keel = "avx512"
    elif keel_512 or keel_bf16:
        keel = "avx2 + AVX-512 " + ("F/BW/VL/DQ" if keel_512 else "BF16")
    else:
        keel = "avx2"
    fork_best = 2 if AVX2 | AVX512 | {"avx512_bf16"} <= flags else 1 if AVX2 <= flags else 0
    fork = ("base", "avx2", "avx512")[min(cap, fork_best)]
    return keel, fork


LEVEL_SCRIPT = """
import json, torch, keel
from keel._native import cpu_isa_status
from keel.vendored.flash_attn import cpu_isa
s = cpu_isa_status()
print(json.dumps({"level": s.level, "keel": s.build, "amx": s.amx, "reason": s.amx_reason, "flash_attn": cpu_isa()}))
"""


@pytest.mark.parametrize("level", LEVELS, ids=lambda v: v or "unset")
def test_a_level_means_the_same_build_in_every_library(level, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KEEL_CPU_ISA"}
    if level is not None:
        env["KEEL_CPU_ISA"] = level
    out = run_python(LEVEL_SCRIPT, env=env, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    keel_build, fork_build = expected_builds(level, _flags())
    assert got["level"] == (level or "auto")
    assert (got["keel"], got["flash_attn"]) == (keel_build, fork_build), (level, got)
    if level in ("base", "avx2", "avx512"):
        assert not got["amx"] and got["reason"] == f"capped by KEEL_CPU_ISA={level}", got
    elif not AVX512 | {"avx512_bf16"} <= _flags():
        assert not got["amx"] and got["reason"] == "this CPU lacks AVX-512 (F/BW/VL/DQ/BF16)", got
    elif not {"amx_tile", "amx_bf16"} <= _flags():
        assert not got["amx"] and "amx_tile/amx_bf16" in got["reason"], got


# keel's three CPU libraries loaded by path, without keel's Python package (which refuses the value first)
DIRECT_SCRIPT = """
import ctypes, json, sys, torch
root = sys.argv[1]
errors = {}
for lib in ("_C", "vendored/deep_gemm/_C", "vendored/flash_attn/_C"):
    torch.ops.load_library(f"{root}/{lib}.abi3.so")
calls = {
    "keel": lambda: torch.ops.keel.fused_muladd(torch.ones(4), torch.ones(4), 1.0),
    "deep_gemm": lambda: torch.ops.keel_deep_gemm.per_token_cast_to_fp8(torch.ones(2, 128), False, 128),
    "flash_attn": lambda: torch.ops.keel_flash_attn.cpu_isa(torch.empty(0)),
}
for name, call in calls.items():
    try:
        call()
        errors[name] = None
    except RuntimeError as exc:
        errors[name] = str(exc)
status = ctypes.CDLL(f"{root}/_C.abi3.so").keel_cpu_isa_status((ctypes.c_int * 4)())
print(json.dumps({"errors": errors, "status": status}))
"""


def test_an_unknown_level_is_refused_by_every_library(tmp_path):
    import keel

    env = dict(os.environ, KEEL_CPU_ISA="avx9000")
    out = run_python(DIRECT_SCRIPT, str(Path(keel.__file__).parent), env=env, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["status"] == -1  # keel_cpu_isa_status: "unknown level", nothing filled in
    for name, error in got["errors"].items():
        assert error is not None, f"{name} ran with KEEL_CPU_ISA=avx9000"
        assert "KEEL_CPU_ISA='avx9000'" in error and "auto, base, avx2, avx512, amx" in error, (name, error)


def test_keel_cpu_isa_is_read_in_one_place_per_language():
    """C++ reads the variable only in csrc/stable/cpu_isa_level.h; Python only in src/keel/_settings.py."""
    readers = []
    for path in [*ROOT.glob("csrc/**/*"), *ROOT.glob("adapters/**/*"), *ROOT.glob("vendored_deps/**/*")]:
        if path.suffix in {".h", ".hpp", ".cpp", ".cu", ".cuh"} and re.search(
            r"getenv\s*\(\s*\"KEEL_CPU_ISA\"", path.read_text(errors="replace")
        ):
            readers.append(str(path.relative_to(ROOT)))
    for path in ROOT.glob("src/keel/**/*.py"):
        if re.search(r"(environ|getenv)\b[^\n]*[\"']KEEL_CPU_ISA[\"']", path.read_text()):
            readers.append(str(path.relative_to(ROOT)))
    assert sorted(readers) == ["csrc/stable/cpu_isa_level.h", "src/keel/_settings.py"], readers
