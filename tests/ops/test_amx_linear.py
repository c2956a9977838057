"""keel::linear's AMX prompt GEMM (csrc/ops/linear_amx_cpu.cpp) and the KEEL_CPU_ISA levels avx512 and amx.

On a CPU with AMX, every bf16 call takes the tile kernel, decode rows included (x packed into the B-tile layout,
the weight read in place as the A operand): one summation order per process, so a row's bits do not depend on
the call's row count (tests/ops/test_row_independence.py checks every row count at every level). Checked against the fp64
product with linear's bounds (fp32 accumulation, one rounding), with tails in every dimension, around the row
threshold, with bias, strided x, nan/inf inputs; results must not depend on the thread count or on which
other rows share the call, and must differ from the AVX-512 path (so the AMX path is what ran). Without AMX
the same calls run the other kernels and the reference checks still hold; the AMX-only checks skip.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import keel_dev.cpu
import pytest
import torch
import torch.nn.functional as F
from keel_dev.forked import run_python
from support.devices import assert_rounded_like

from keel import ops


def _cpu_has_amx_flags() -> bool:
    return {"amx_tile", "amx_bf16", "avx512_bf16"} <= keel_dev.cpu.flags()


HAS_AMX = _cpu_has_amx_flags()
needs_amx = pytest.mark.skipif(not HAS_AMX, reason="needs a CPU with AMX (amx_tile, amx_bf16)")


def _rand(shape: tuple[int, ...], seed: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


def _check(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> None:
    # test_linear.py's bounds: fp32 accumulation, then one rounding to bf16
    want = F.linear(x.double(), w.double(), None if bias is None else bias.double())
    assert out.shape == want.shape and out.dtype == x.dtype and out.is_contiguous()
    scale = max(1.0, x.shape[-1] ** 0.5)
    torch.testing.assert_close(out.double(), want, atol=1e-2 * scale, rtol=1e-2)
    assert_rounded_like(out, want.to(x.dtype), x.dtype, max_ulps=None)


def _child(code: str, isa: str | None, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "KEEL_CPU_ISA"}
    if isa is not None:
        env["KEEL_CPU_ISA"] = isa
    # outside the checkout: `python -c` puts the working directory first on sys.path
    return run_python(code, env=env, cwd=tmp_path, timeout=300)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 16, 17, 31, 32, 33, 70])
@pytest.mark.parametrize("k, n", [(1, 7), (33, 45), (64, 32), (100, 1), (576, 960), (1536, 70)], ids=str)
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_matches_reference(m, k, n, with_bias):
    x, w = _rand((m, k), 1), _rand((n, k), 2)
    bias = _rand((n,), 3) if with_bias else None
    _check(ops.linear(x, w, bias), x, w, bias)


@pytest.mark.parametrize("k, n", [(70, 45), (64, 96)], ids=["padded-panel", "in-place-panel"])
def test_strided_inputs(k, n):
    # weight rows padded (row stride > K: whole 32-row, 32k-wide panels load their A tiles with it, partial
    # ones are copied), x 3-D and strided, bias strided
    w = _rand((n, k + 9), 4)[:, :k]
    bias = _rand((2 * n,), 5)[::2]
    x = _rand((8, 3, 2 * k), 6)[..., ::2].transpose(0, 1)
    out = ops.linear(x, w, bias)
    assert out.shape == (3, 8, n)
    _check(out.reshape(24, n), x.reshape(24, k), w, bias)


def test_nonfinite_inputs():
    m, k, n = 20, 100, 40
    x, w, bias = _rand((m, k), 7), _rand((n, k), 8), _rand((n,), 9)
    x[2, 5] = float("nan")
    x[4, 50] = float("inf")
    x[6, 0] = -float("inf")
    w[11, 99] = float("inf")  # in the last, partial K step
    w[12, 3] = 0.0
    x[8, 3] = float("inf")  # times w[12, 3] == 0: nan in column 12 only
    bias[30] = float("nan")
    out = ops.linear(x, w, bias).double()
    want = F.linear(x.double(), w.double(), bias.double())
    assert torch.equal(out.isnan(), want.isnan())
    assert torch.equal(out.isinf(), want.isinf()) and torch.equal(out[out.isinf()], want[want.isinf()])
    assert bool(out[2].isnan().all()) and bool(out[:, 30].isnan().all())
    finite = want.isfinite()
    torch.testing.assert_close(out[finite], want[finite], atol=0.1, rtol=1e-2)


def test_thread_count_does_not_change_bits():
    # 30 and 3 output blocks of 32 split over the pool; the rounding tails too
    cases = [((70, 576), (960, 576)), ((33, 100), (70, 100)), ((5, 1536), (576, 1536))]
    before = torch.get_num_threads()
    try:
        for xs, ws in cases:
            x, w, b = _rand(xs, 10), _rand(ws, 11), _rand((ws[0],), 12)
            torch.set_num_threads(1)
            one = ops.linear(x, w, b)
            torch.set_num_threads(2)
            two = ops.linear(x, w, b)
            assert torch.equal(one.view(torch.int16), two.view(torch.int16)), (xs, ws)
    finally:
        torch.set_num_threads(before)


def test_rows_do_not_depend_on_the_other_rows_of_the_call():
    # a row's bits do not depend on the others, nor on how many there are (decode-sized calls included)
    x, w = _rand((70, 576), 13), _rand((200, 576), 14)
    full = ops.linear(x, w, None)
    for a, b in ((0, 1), (7, 8), (3, 5), (9, 12), (0, 5), (3, 40), (31, 70), (60, 70)):
        assert torch.equal(ops.linear(x[a:b], w, None), full[a:b]), (a, b)


# Runs in a child per KEEL_CPU_ISA level: the reference check at decode and prompt row counts, and the bits
# printed (as hashes: the call of 4 rows, then the prompt calls) so that levels can be compared.
LEVEL_SCRIPT = r"""
import hashlib, torch, torch.nn.functional as F
from keel import ops
torch.manual_seed(0)
digests = []
for m in (4, 5, 17, 64):
    digest = hashlib.sha256()
    for k, n in ((1536, 96), (33, 45)):
        x, w, b = torch.randn(m, k).bfloat16(), torch.randn(n, k).bfloat16(), torch.randn(n).bfloat16()
        out = ops.linear(x, w, b)
        want = F.linear(x.double(), w.double(), b.double())
        torch.testing.assert_close(out.double(), want, atol=1e-2 * k ** 0.5, rtol=1e-2)
        digest.update(out.view(torch.int16).numpy().tobytes())
    digests.append(digest.hexdigest())
print("ok", digests[0], "".join(digests[1:]))
"""
# base and avx2 run in tests/ops/test_linear.py's test_cpu_isa_paths
LEVELS = ["amx", "avx512", "auto"]


@pytest.fixture(scope="module")
def levels(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    where = tmp_path_factory.mktemp("levels")
    return {isa: _child(LEVEL_SCRIPT, isa, where) for isa in LEVELS if isa != "amx" or HAS_AMX}


@pytest.mark.slow  # a child process per CPU build level
@pytest.mark.parametrize("isa", LEVELS)
def test_every_level_matches_reference(isa, levels):
    if isa not in levels:
        pytest.skip("needs a CPU with AMX")
    out = levels[isa]
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stdout + out.stderr


@needs_amx
def test_amx_is_what_runs(levels):
    # auto picks AMX (same bits as amx); avx512 is the AVX512-BF16 kernel, whose sums differ in some bits (the
    # 4-row call runs on AMX too, but its few outputs may round alike in both orders: not compared)
    got = {isa: out.stdout.split() for isa, out in levels.items()}
    assert all(v[0] == "ok" for v in got.values()), got
    assert got["amx"] == got["auto"]
    assert got["amx"][2] != got["avx512"][2]


def test_doctor_names_the_amx_state(tmp_path):
    # `keel doctor`'s ISA line asks the library (a KEEL_CPU_ISA=amx child) whether the prompt GEMMs run on AMX
    from keel.cli import doctor

    state = doctor._amx_state()
    forced = os.environ.get("KEEL_CPU_ISA") or "auto"
    if forced not in ("auto", "amx"):
        assert state == f"no AMX (capped by KEEL_CPU_ISA={forced})", state
    elif HAS_AMX:
        assert state == "AMX", state
    else:
        assert state.startswith("no AMX ("), state


def test_rounding_matches_torch_bit_for_bit():
    # K = 1: each output is x * w (exact in fp32) plus the bias in fp32, rounded once to bf16, as torch rounds
    # it; every bf16 mantissa times 16 others over exponents reaching overflow, tiny and huge results
    mant = 1.0 + torch.arange(128, dtype=torch.float64) / 128
    w = torch.cat([mant * s for s in (1.0, 2.0**-60, -(2.0**3), 2.0**60, 2.0**126, 2.0**-100)]).to(torch.bfloat16)
    x = (1.0 + torch.arange(1, 33, 2, dtype=torch.float64) / 32).to(torch.bfloat16)
    x[3] = -x[3]
    bias = _rand((w.numel(),), 15)
    for b in (None, bias):
        out = ops.linear(x[:, None], w[:, None], b)
        want = x.float()[:, None] * w.float()[None, :]
        if b is not None:
            want = want + b.float()
        exact = want.double()
        want = want.to(torch.bfloat16)
        assert int((want.double() != exact).sum()) > want.numel() // 2  # most values need rounding
        nan = out.isnan() & want.isnan()
        assert bool(((out.view(torch.int16) == want.view(torch.int16)) | nan).all())


def test_subnormal_sums_are_rounded_not_flushed():
    # tile sums of zero plus a subnormal bias are subnormal: stored as the bias, not as zero
    n = 64
    bias = (torch.arange(1, n + 1, dtype=torch.float64) * 2.0**-133).to(torch.bfloat16)
    assert bool((bias != 0).all()) and bool((bias.float().abs() < torch.finfo(torch.float32).tiny).all())
    out = ops.linear(torch.zeros(8, 40, dtype=torch.bfloat16), _rand((n, 40), 16), bias)
    assert torch.equal(out.view(torch.int16), bias.expand(8, n).view(torch.int16))
