"""keel_flash_attn as torch ops: opcheck (schema, fake kernels, dispatch) on every op, and every CPU
build of the kernels (KEEL_CPU_ISA=base|avx2, and the best one) against the fp64 reference."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from flash_attn_ref import cu, paged

from keel.vendored.flash_attn import _ops, cpu_isa

HERE = Path(__file__).resolve().parent


def test_opcheck_varlen_fwd_packed_and_paged():
    gen = torch.Generator().manual_seed(0)
    lens = [3, 5]
    q = torch.randn(8, 4, 64, generator=gen)
    k = torch.randn(8, 2, 64, generator=gen)
    v = torch.randn(8, 2, 64, generator=gen)
    torch.library.opcheck(
        torch.ops.keel_flash_attn.varlen_fwd,
        (q, k, v, cu(lens), cu(lens), None, None, 5, 5, 0.125, True, -1, -1, 0.0, 0),
    )
    pg = paged(k, v, lens, 16, gen)
    torch.library.opcheck(
        torch.ops.keel_flash_attn.varlen_fwd,
        (q, pg.k_cache, pg.v_cache, cu(lens), None, pg.seqlens, pg.block_table, 5, 5, 0.125, True, 2, 0, 0.0, 0),
    )


def test_opcheck_fwd_kvcache():
    gen = torch.Generator().manual_seed(1)
    pg = paged(torch.randn(40, 2, 64, generator=gen), torch.randn(40, 2, 64, generator=gen), [24, 16], 16, gen)
    q = torch.randn(2, 1, 4, 64, generator=gen).bfloat16()
    torch.library.opcheck(
        torch.ops.keel_flash_attn.fwd_kvcache,
        (q, pg.k_cache.bfloat16(), pg.v_cache.bfloat16(), pg.seqlens, pg.block_table, 0.125, True, -1, -1, 0.0, 2),
    )


def test_namespace_and_ops():
    assert _ops.NAMESPACE == "keel_flash_attn"
    assert set(_ops.OPS) == {"varlen_fwd", "fwd_kvcache", "cpu_isa", "last_splitkv_stats"}
    assert _ops.LIBRARY.cpu.name == "_C.abi3.so"


ISA_CHECK = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {here!r})
    from flash_attn_ref import attention_ref, cu, paged, tolerance, varlen_ref
    from keel.vendored.flash_attn import cpu_isa, flash_attn_varlen_func, flash_attn_with_kvcache
    print(cpu_isa())
    gen = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for h, hk, d in ((9, 3, 64), (4, 4, 40)):
            lens = [5, 19, 1]
            q = torch.randn(sum(lens), h, d, generator=gen).to(dtype)
            k = torch.randn(sum(lens), hk, d, generator=gen).to(dtype)
            v = torch.randn(sum(lens), hk, d, generator=gen).to(dtype)
            out = flash_attn_varlen_func(q, k, v, cu(lens), cu(lens), 19, 19, causal=True, softcap=8.0)
            ref = varlen_ref(q, k, v, lens, lens, causal=True, softcap=8.0)
            torch.testing.assert_close(out.double(), ref, **tolerance(dtype))
            pg = paged(k, v, lens, 16, gen)
            qd = torch.randn(3, 1, h, d, generator=gen).to(dtype)
            out = flash_attn_with_kvcache(qd, pg.k_cache, pg.v_cache, cache_seqlens=pg.seqlens,
                                          block_table=pg.block_table, num_splits=2)
            off = 0
            for i, n in enumerate(lens):
                ref = attention_ref(qd[i], k[off:off + n], v[off:off + n])
                torch.testing.assert_close(out[i].double(), ref, **tolerance(dtype))
                off += n
    print("OK")
""")


def _best_isa() -> str:
    return cpu_isa()


@pytest.mark.parametrize("isa", ["base", "avx2", None])
def test_every_cpu_build_matches_reference(isa, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KEEL_CPU_ISA"}
    if isa:
        env["KEEL_CPU_ISA"] = isa
    best = _best_isa()
    if isa == "avx2" and best == "base":
        pytest.skip("this CPU has no AVX2")
    out = subprocess.run(
        [sys.executable, "-c", ISA_CHECK.format(here=str(HERE))],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    ran, status = out.stdout.split()
    assert ran == (isa or best), f"KEEL_CPU_ISA={isa} ran the {ran} build"
    assert status == "OK"
