"""Every CPU build of the fork's kernel (base, AVX2, AVX-512) is correct; KEEL_CPU_ISA=base|avx2 caps
the choice through the adapter as it does for keel's own ops (each run in its own process)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

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


def _run(isa: str, cwd) -> str:
    env = dict(os.environ, KEEL_CPU_ISA=isa)
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=180, cwd=cwd)
    assert out.returncode == 0, f"KEEL_CPU_ISA={isa}: {out.stdout}{out.stderr[-3000:]}"
    return out.stdout.strip()


def test_every_isa_build_is_correct_and_selected(tmp_path):
    if not os.path.exists("/proc/cpuinfo") or "avx512_bf16" not in open("/proc/cpuinfo").read():
        pytest.skip("needs a CPU with every ISA the builds use (AVX-512 BF16)")
    digests = {isa: _run(isa, tmp_path) for isa in ("base", "avx2", "auto")}
    # the builds reduce in different orders (1, 8, 16 lanes): distinct bits show each run used its own build
    assert len(set(digests.values())) == 3, f"KEEL_CPU_ISA did not switch the kernel build: {digests}"
