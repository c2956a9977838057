"""Every CPU build of the fork's kernel (base, AVX2, AVX-512) is correct; KEEL_CPU_ISA caps the choice through
the adapter as it does for keel's own ops (each level run in its own process): base and avx2 cap it there,
avx512, amx (the fork has no AMX kernels) and auto run its best build (the table in docs/ops.md)."""

from __future__ import annotations

import os

import keel_dev.cpu
import pytest
from keel_dev.forked import run_python

SCRIPT = r"""
import hashlib, torch
from keel.vendored import deep_gemm as dg
g = torch.Generator().manual_seed(7)
m, n, k = 3, 130, 300
(a, sfa), (b, sfb) = dg.per_token_cast_to_fp8(torch.randn(m, k, generator=g)), dg.per_block_cast_to_fp8(torch.randn(n, k, generator=g))
raw = b.view(torch.uint8).clone(); raw[9, 40] = 0xFF; raw[3, 7] = 0x05; raw[4, 200] = 0x82  # -NaN, subnormals
b = raw.view(torch.float8_e4m3fn)
d = torch.empty(m, n)
dg.fp8_gemm_nt((a, sfa), (b, sfb), d)
deq_a = a.double() * sfa.double().repeat_interleave(128, 1)[:, :k]
deq_b = b.double() * sfb.double().repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
ref = deq_a @ deq_b.T
ok = torch.arange(n) != 9
assert bool(d[:, 9].isnan().all()) and not bool(d[:, ok].isnan().any()), "NaN byte not propagated"
assert dg.calc_diff(d[:, ok], ref[:, ok]) < 1e-9, dg.calc_diff(d[:, ok], ref[:, ok])
h = torch.empty(m, n, dtype=torch.bfloat16)
dg.bf16_gemm_nt(deq_a.bfloat16(), deq_b.bfloat16(), h)
assert dg.calc_diff(h[:, ok], (deq_a.bfloat16().double() @ deq_b.bfloat16().double().T)[:, ok]) < 2e-5
print(hashlib.sha256(d[:, ok].numpy().tobytes()).hexdigest())
"""


AVX2 = {"avx2", "fma", "f16c"}  # what the fork's avx2 build is compiled for (runtime.cpp best_supported)
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}


def best_build(flags: set[str]) -> str:
    """The build the fork picks on a CPU with `flags`, computed here independently of the fork."""
    return "avx512" if AVX512 <= flags else "avx2" if AVX2 <= flags else "base"


def expected_runs(flags: set[str]) -> dict[str, str]:
    """KEEL_CPU_ISA value -> the build that must run: a cap above what the CPU has falls back to the best."""
    best = best_build(flags)
    avx2 = "base" if best == "base" else "avx2"
    return {"base": "base", "avx2": avx2, "avx512": best, "amx": best, "auto": best}


def _run(isa: str, cwd) -> str:
    env = dict(os.environ, KEEL_CPU_ISA=isa)
    out = run_python(SCRIPT, env=env, timeout=180, cwd=cwd)
    assert out.returncode == 0, f"KEEL_CPU_ISA={isa}: {out.stdout}{out.stderr[-3000:]}"
    return out.stdout.strip()


@pytest.mark.slow  # a child process per CPU build
def test_every_isa_build_is_correct_and_selected(tmp_path):
    # every build this CPU runs is checked against the fp64 reference (SCRIPT); the builds reduce in
    # different orders (1, 8, 16 lanes), so equal digests mean the same build ran, distinct ones another
    runs = expected_runs(keel_dev.cpu.flags())
    digests = {isa: _run(isa, tmp_path) for isa in runs}
    for a in runs:
        for b in runs:
            same = runs[a] == runs[b]
            assert (digests[a] == digests[b]) == same, (
                f"KEEL_CPU_ISA={a} should run the {runs[a]} build and KEEL_CPU_ISA={b} the {runs[b]} build: {digests}"
            )


def test_base_and_avx2_are_checked_on_cpus_without_avx512_bf16():
    # an AVX2 CPU without AVX-512 BF16 (most of them) checks both of its builds, a baseline CPU its one
    avx2_only = {"sse2", *AVX2, "avx512f", "avx512bw", "avx512vl", "avx512dq"}
    assert expected_runs(avx2_only) == {"base": "base", "avx2": "avx2", "avx512": "avx2", "amx": "avx2", "auto": "avx2"}
    assert expected_runs({"sse2"}) == {"base": "base", "avx2": "base", "avx512": "base", "amx": "base", "auto": "base"}
    assert expected_runs(AVX512) == {
        "base": "base",
        "avx2": "avx2",
        "avx512": "avx512",
        "amx": "avx512",
        "auto": "avx512",
    }
