"""The same bits whatever the call, for attention: a query's output is the same bits whatever call computes it.

The engine computes query i of a sequence in a varlen prefill of the whole prompt (contiguous K/V or the paged
cache), in a prefill of the prompt's tail with the prefix from the paged cache (a prefix-cache hit), alone
or batched with other sequences of other lengths, or as a decode query (`flash_attn_with_kvcache`), on one
thread or many. Every one of these must give the bits of the whole-prompt prefill: split-K (which the kernel
may choose for a long context when the other work items are few) must not change them either.

Each case runs at every CPU build of the kernels this CPU has, in a child process (KEEL_CPU_ISA caps the
build once per process: base, avx2, and auto = avx512 where the CPU has it).
"""

from __future__ import annotations

import os
from pathlib import Path

import keel_dev.cpu
import pytest
from keel_dev.forked import run_python

_TESTS = Path(__file__).resolve().parents[2]  # tests/: the child imports support.flash_attn_ref


FLAGS = keel_dev.cpu.flags()
LEVELS = [("base", True), ("avx2", {"avx2", "fma", "f16c"} <= FLAGS), ("auto", True)]

CHILD = r"""
import torch
from support.flash_attn_ref import cu, paged
from keel.vendored.flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache, last_splitkv_stats

fails = []


def bits(t):
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16)


def compare(name, got, want):
    bad = (bits(got) != bits(want)).flatten(1).any(1).nonzero().flatten().tolist()
    if bad:
        fails.append(f"{name}: query rows {bad[:6]} ({len(bad)} of {got.shape[0]}) differ from the whole prefill")


def run(dtype, h, hk, d, block_size, lens, window):
    gen = torch.Generator().manual_seed(sum(lens) + d)
    total = sum(lens)
    q = torch.randn(total, h, d, generator=gen).to(dtype)
    k = torch.randn(total, hk, d, generator=gen).to(dtype)
    v = torch.randn(total, hk, d, generator=gen).to(dtype)
    starts = [sum(lens[:i]) for i in range(len(lens))]
    kw = dict(causal=True, window_size=window)
    # the reference: each sequence's whole prompt alone, contiguous K/V
    whole = torch.cat(
        [
            flash_attn_varlen_func(q[s : s + n], k[s : s + n], v[s : s + n], cu([n]), cu([n]), n, n, **kw)
            for s, n in zip(starts, lens)
        ]
    )
    tag = f"{dtype} h={h}/{hk} d={d} block={block_size} lens={lens} window={window}"
    # all sequences in one varlen call, contiguous K/V
    got = flash_attn_varlen_func(q, k, v, cu(lens), cu(lens), max(lens), max(lens), **kw)
    compare(f"batched varlen prefill [{tag}]", got, whole)
    # the same through the paged cache (every token's K/V already in the cache, as the engine writes it first)
    pg = paged(k, v, lens, block_size, gen)
    got = flash_attn_varlen_func(
        q, pg.k_cache, pg.v_cache, cu(lens), None, max(lens), max(lens), block_table=pg.block_table,
        seqused_k=pg.seqlens, **kw
    )
    compare(f"batched paged prefill [{tag}]", got, whole)
    # a cached prefix: only each sequence's last `tail` queries are computed, the rest comes from the cache
    for tail in (1, 3, 17):
        lq = [min(tail, n) for n in lens]
        rows = torch.cat([torch.arange(s + n - t, s + n) for s, n, t in zip(starts, lens, lq)])
        got = flash_attn_varlen_func(
            q[rows], pg.k_cache, pg.v_cache, cu(lq), None, max(lq), max(lens), block_table=pg.block_table,
            seqused_k=pg.seqlens, **kw
        )
        compare(f"prefill of the last {tail} with the prefix cached [{tag}]", got, whole[rows])
    # decode: the last query of every sequence, batched, then each alone; and one thread against the pool
    last = torch.tensor([s + n - 1 for s, n in zip(starts, lens)])
    dec = dict(cache_seqlens=pg.seqlens, block_table=pg.block_table, **kw)
    got = flash_attn_with_kvcache(q[last].unsqueeze(1), pg.k_cache, pg.v_cache, **dec).squeeze(1)
    compare(f"batched decode [{tag}]", got, whole[last])
    for b in range(len(lens)):
        got = flash_attn_with_kvcache(
            q[last[b : b + 1]].unsqueeze(1), pg.k_cache, pg.v_cache, cache_seqlens=pg.seqlens[b : b + 1],
            block_table=pg.block_table[b : b + 1], **kw
        ).squeeze(1)
        compare(f"decode of sequence {b} alone ({lens[b]} keys, splits {last_splitkv_stats()[0]}) [{tag}]", got,
                whole[last[b : b + 1]])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = flash_attn_with_kvcache(q[last].unsqueeze(1), pg.k_cache, pg.v_cache, **dec).squeeze(1)
    finally:
        torch.set_num_threads(before)
    compare(f"batched decode on 1 thread [{tag}]", one, whole[last])


# SmolLM2's heads (9 query heads on 3 kv heads, head dim 64), the engine's 16-token pages and bigger ones;
# contexts past 512 keys (where split-K used to start), one token, a page exactly
for dtype in (torch.bfloat16, torch.float32):
    run(dtype, 9, 3, 64, 16, [700, 1, 16, 45, 1300], (-1, -1))
    run(dtype, 4, 1, 128, 32, [600, 33, 2], (-1, -1))
    run(dtype, 8, 2, 64, 16, [90, 530], (40, 0))
print("ok" if not fails else "\n".join(fails))
"""


@pytest.mark.parametrize("isa, available", LEVELS, ids=[lv for lv, _ in LEVELS])
def test_query_does_not_depend_on_the_call(isa, available, tmp_path):
    if not available:
        pytest.skip(f"this CPU has no {isa} build")
    env = {**os.environ, "KEEL_CPU_ISA": isa}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_TESTS), env.get("PYTHONPATH")) if p)
    out = run_python(CHILD, env=env, cwd=tmp_path, timeout=900)
    assert out.returncode == 0 and out.stdout.strip() == "ok", f"KEEL_CPU_ISA={isa}:\n{out.stdout}{out.stderr}"
