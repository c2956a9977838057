"""`dtype="auto"` on the CPU: bf16 wherever keel's kernels read 2-byte weights at speed (native bf16 arithmetic, or
the AVX2 build, which widens them in registers), fp32 only on the baseline build; the CPU's flags decide."""

from __future__ import annotations

import os

import keel_dev.cpu
import pytest
import torch
from keel_dev.forked import run_python

from keel.engine.dtypes import default_dtype, resolve_dtype

FLAGS = keel_dev.cpu.flags()
NATIVE_BF16 = "avx512_bf16" in FLAGS or "amx_tile" in FLAGS
AVX2_BUILD = {"avx2", "fma", "f16c"} <= FLAGS


def expected(level: str) -> torch.dtype:
    return torch.bfloat16 if NATIVE_BF16 or (AVX2_BUILD and level != "base") else torch.float32


def test_auto_on_this_cpu():
    level = os.environ.get("KEEL_CPU_ISA") or "auto"
    cpu = torch.device("cpu")
    assert default_dtype(cpu) == expected(level)
    assert resolve_dtype("auto", cpu) == resolve_dtype(None, cpu) == expected(level)
    assert resolve_dtype("fp32", cpu) == torch.float32  # a named dtype is never replaced


@pytest.mark.skipif(NATIVE_BF16 or not AVX2_BUILD, reason="needs an AVX2 CPU without native bf16")
def test_auto_follows_the_kernels_build():
    """The same CPU with its kernels capped at the baseline build (KEEL_CPU_ISA=base) stores fp32."""
    code = "import torch; from keel.engine.dtypes import default_dtype; print(default_dtype(torch.device('cpu')))"
    env = {**os.environ, "KEEL_CPU_ISA": "base"}
    out = run_python(code, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "torch.float32"
