"""The same bits whatever the call, at the op level: a row's result of keel.ops.linear / keel.ops.fp8_linear is the same bits
whatever call it is in (how many rows the call has, where the row sits in it, which other rows share it,
how many threads run it), at every KEEL_CPU_ISA level this CPU has (AMX included where it exists).

The engine computes a prompt's token in a prompt call of many rows the first time and in a call of few rows
when the prompt's prefix is cached (or when it is decoded): if the kernels' summation order per output
depended on the call's row count, a greedy answer would change with the cache and the batch.

Each level runs in a child process (the ISA is chosen once per process). On a CPU without AMX the `amx` level
skips; on one with AMX it checks the AMX kernels against the 1-row calls (the verdict a session without AMX
cannot give).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import keel_dev.cpu
import pytest
from keel_dev.forked import run_python

FLAGS = keel_dev.cpu.flags()
HAS_AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= FLAGS
HAS_AVX512BF16 = HAS_AVX512 and "avx512_bf16" in FLAGS
HAS_AMX = HAS_AVX512BF16 and {"amx_tile", "amx_bf16"} <= FLAGS
HAS_AVX2 = {"avx2", "fma", "f16c"} <= FLAGS

# (level, available here): the levels cap what runs, so a level above the CPU's would test a lower one again
LEVELS = [("base", True), ("avx2", HAS_AVX2), ("avx512", HAS_AVX512), ("amx", HAS_AMX), ("auto", True)]

# The child: every row of an M-row call (M = 1..70, the rows a prefix and a suffix of 70) against the same
# row alone; then a row of inf / of tiny values / of huge values among the others (the FP8 kernel picks its
# bf16 fast path from the values of x); then 1 thread against the pool. Prints "ok" or the failures.
CHILD = r"""
import sys
import torch
from keel import ops
from keel.vendored import deep_gemm as dg

ROWS = 70
fails = []


def bits(t):
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16)


def same_rows(got, want):
    # rows of got whose bits differ from want's (nan payloads included: the kernels write one quiet nan)
    return (bits(got) != bits(want)).any(-1).nonzero().flatten().tolist()


def check(name, fn, x):
    alone = torch.cat([fn(x[i : i + 1]) for i in range(ROWS)])
    bad_calls = []
    for m in range(1, ROWS + 1):
        for where, rows in (("first", slice(0, m)), ("last", slice(ROWS - m, ROWS))):
            bad = same_rows(fn(x[rows]), alone[rows])
            if bad:
                bad_calls.append(f"M={m} ({where} {m} of {ROWS}): rows {bad[:4]}")
    if bad_calls:
        fails.append(f"{name}: {len(bad_calls)} of {2 * ROWS} calls differ from 1-row calls, e.g. {bad_calls[:3]}")
    return alone


def neighbours(name, fn, x, alone):
    # one odd row among ordinary ones must not change the ordinary rows
    for label, value in (("inf", float("inf")), ("tiny", 1e-30), ("huge", 1e30)):
        y = x[:12].clone()
        y[5] = y[5] * value if label != "inf" else y[5]
        if label == "inf":
            y[5, 3] = value
        out = fn(y)
        keep = [i for i in range(12) if i != 5]
        bad = same_rows(out[keep], alone[keep])
        if bad:
            fails.append(f"{name}: a {label} row among 12 changes rows {[keep[i] for i in bad][:6]}")


def threads(name, fn, x):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = fn(x)
        torch.set_num_threads(max(2, before))
        many = fn(x)
    finally:
        torch.set_num_threads(before)
    bad = same_rows(one, many)
    if bad:
        fails.append(f"{name}: rows {bad[:6]} differ between 1 thread and the pool")


def spread(*shape, span):
    # normal values times powers of two over 2 * span octaves: big terms that cancel, so the sums' last bits
    # show through the output's rounding (a bf16 output hides most fp32 differences of ordinary data)
    return torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-span, span + 1, shape, generator=g).float())


g = torch.Generator().manual_seed(0)
for dt in (torch.bfloat16, torch.float32):
    for k, n in ((100, 37), (576, 67), (1536, 20)):
        # even rows cancel: [u, -u] against weight rows [v, v] sum to about 0 through big terms, so the
        # output is the rounding noise of the sum's order; odd rows are plain
        x = spread(ROWS, k, span=12)
        x[::2, k // 2 :] = -x[::2, : k // 2]
        x = x.to(dt)
        w = spread(n, k, span=4)
        w[:, k // 2 :] = w[:, : k // 2]
        b = torch.randn(n, generator=g).to(dt)
        wd = w.to(dt)
        q, s = dg.per_token_cast_to_fp8(w)
        cases = [
            (f"linear {dt} k={k} n={n}", lambda t: ops.linear(t, wd, b)),
            (f"fp8_linear {dt} k={k} n={n}", lambda t: ops.fp8_linear(t, q, s, b)),
        ]
        for name, fn in cases:
            alone = check(name, fn, x)
            neighbours(name, fn, x, alone)
            threads(name, fn, x[:40])
print("ok" if not fails else "\n".join(fails))
"""


def _child(isa: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "KEEL_CPU_ISA": isa}
    # outside the checkout: `python -c` puts the working directory first on sys.path
    return run_python(CHILD, env=env, cwd=tmp_path, timeout=900)


@pytest.mark.parametrize("isa, available", LEVELS, ids=[lv for lv, _ in LEVELS])
def test_rows_do_not_depend_on_the_call(isa, available, tmp_path):
    if not available:
        pytest.skip(f"this CPU has no {isa} level (it would test a lower level again)")
    out = _child(isa, tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "ok", f"KEEL_CPU_ISA={isa}:\n{out.stdout}{out.stderr}"
