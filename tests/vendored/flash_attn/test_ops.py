"""keel_flash_attn as torch ops: opcheck (schema, fake kernels, dispatch) on every op, and every CPU
build of the kernels (KEEL_CPU_ISA=base|avx2, and the best one) against the fp64 reference."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import keel_dev.cpu
import pytest
import torch
from keel_dev.forked import run_python
from support.flash_attn_ref import cu, paged

from keel.vendored.flash_attn import _ops

TESTS = Path(__file__).resolve().parents[2]  # on the child's PYTHONPATH, for `support`


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
    from support.flash_attn_ref import attention_ref, cu, paged, tolerance, varlen_ref
    from keel.vendored.flash_attn import cpu_isa, flash_attn_varlen_func, flash_attn_with_kvcache, last_splitkv_stats
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
            assert last_splitkv_stats() == (2, 2 * 3 * h), last_splitkv_stats()  # this build's split-K ran
            off = 0
            for i, n in enumerate(lens):
                ref = attention_ref(qd[i], k[off:off + n], v[off:off + n])
                torch.testing.assert_close(out[i].double(), ref, **tolerance(dtype))
                off += n
    print("OK")
""")


AVX2 = {"avx2", "fma", "f16c"}  # what the fork's builds are compiled for (flash_api.cpp supported_isa)
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}


def expected_isa(requested: str | None, flags: set[str]) -> str:
    """The build that must run for KEEL_CPU_ISA=`requested` on a CPU with `flags`, worked out here from
    the CPU's flags (not from the library): the best the CPU runs, capped by the request."""
    order = ["base", "avx2", "avx512"]
    best = "avx512" if AVX512 <= flags else "avx2" if AVX2 <= flags else "base"
    cap = requested or "avx512"
    return order[min(order.index(best), order.index(cap))]


def test_expected_isa_caps_the_best_build():
    assert expected_isa(None, AVX512) == "avx512" and expected_isa("avx2", AVX512) == "avx2"
    assert expected_isa(None, AVX2 | {"avx512f"}) == "avx2" and expected_isa("avx2", {"sse2"}) == "base"
    assert expected_isa("base", AVX512) == "base"


# the default build in the quick tier; the other CPU builds (a child process each) only in the whole suite
@pytest.mark.parametrize(
    "isa", [pytest.param("base", marks=pytest.mark.slow), pytest.param("avx2", marks=pytest.mark.slow), None]
)
def test_every_cpu_build_matches_reference(isa, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KEEL_CPU_ISA"}
    if isa:
        env["KEEL_CPU_ISA"] = isa
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH")) if p)  # `support`
    out = run_python(ISA_CHECK.format(), timeout=300, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    ran, status = out.stdout.split()
    assert ran == expected_isa(isa, keel_dev.cpu.flags()), f"KEEL_CPU_ISA={isa} ran the {ran} build"
    assert status == "OK"
