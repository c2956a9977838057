"""flash_attn's CUDA twin against the fp64 reference and the CPU twin: varlen, paged varlen, paged and dense
kvcache; causal and not; windows on the left, the right and both; softcap on and off; head dims 64 / 128 /
256; GQA 1 / 4 / 8; num_splits (ignored on CUDA: every value gives the same bytes); a side stream; host
checks (devices, max_seqlen_q, zero heads, a batch above 65535) and, in child processes, the device-side
asserts of index data the host does not read. Skipped without a GPU: no GPU has run these yet (compiled,
not run). Tolerances: flash_attn_ref.tolerance (fp32 accumulation, output rounded to the input dtype),
twice that against the CPU twin (both within it of fp64).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from support.flash_attn_ref import attention_ref, cu, paged, tolerance, varlen_ref

from keel.vendored.flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# (mode, causal, window, softcap, head_dim, q heads per kv head, dtype): every value of each axis, and
# each mode with causal and not, a window and none, softcap and none
CASES = [
    ("varlen", True, (-1, -1), 0.0, 64, 1, "bf16"),
    ("varlen", False, (20, -1), 10.0, 128, 4, "fp16"),
    ("varlen", False, (-1, 5), 0.0, 256, 8, "fp32"),
    ("varlen", True, (8, 3), 30.0, 64, 8, "fp16"),
    ("varlen", False, (8, 3), 0.0, 128, 1, "bf16"),
    ("paged", True, (20, -1), 10.0, 64, 4, "bf16"),
    ("paged", False, (-1, -1), 0.0, 128, 8, "fp32"),
    ("paged", False, (-1, 5), 30.0, 256, 1, "fp16"),
    ("paged", True, (-1, -1), 0.0, 256, 4, "bf16"),
    ("kv_paged", True, (-1, -1), 0.0, 64, 8, "bf16"),
    ("kv_paged", False, (20, -1), 10.0, 128, 1, "fp32"),
    ("kv_paged", True, (16, -1), 0.0, 256, 4, "fp16"),
    ("kv_paged", False, (-1, 2), 0.0, 64, 4, "fp16"),
    ("kv_dense", True, (-1, -1), 10.0, 128, 4, "bf16"),
    ("kv_dense", False, (8, 3), 0.0, 64, 1, "fp32"),
    ("kv_dense", True, (20, -1), 0.0, 256, 8, "bf16"),
]
LENS_Q, LENS_K = [7, 1, 0, 40, 3], [7, 33, 0, 70, 1]  # a prompt, a decode token, an empty one, prefix + chunk


def _twin_tol(dtype: torch.dtype) -> dict[str, float]:
    return {name: 2 * v for name, v in tolerance(dtype).items()}


def _run_case(mode, causal, window, softcap, d, ratio, dtype, num_splits=0, device="cuda"):
    """(out on `device`, fp64 reference) for one case; the inputs are the same for every device."""
    gen = torch.Generator().manual_seed(sum(map(ord, mode)) * 1000 + d + ratio)  # the same inputs on every device
    hk = 2
    h = hk * ratio
    kw = dict(causal=causal, window_size=window, softcap=softcap, num_splits=num_splits)
    if mode in ("varlen", "paged"):
        lens_q = LENS_Q if causal else [7, 1, 0, 40, 5]  # non-causal: a sequence with more queries than keys
        q = torch.randn(sum(lens_q), h, d, generator=gen).to(dtype)
        k = torch.randn(sum(LENS_K), hk, d, generator=gen).to(dtype)
        v = torch.randn(sum(LENS_K), hk, d, generator=gen).to(dtype)
        ref = varlen_ref(q, k, v, lens_q, LENS_K, causal=causal, window=window, softcap=softcap)
        args = (cu(lens_q).to(device), max(lens_q), max(LENS_K))
        if mode == "varlen":
            out = flash_attn_varlen_func(
                q.to(device), k.to(device), v.to(device), args[0], cu(LENS_K).to(device), *args[1:], **kw
            )
        else:
            pg = paged(k, v, LENS_K, 16, gen)
            out = flash_attn_varlen_func(
                q.to(device), pg.k_cache.to(device), pg.v_cache.to(device), args[0], None, *args[1:],
                block_table=pg.block_table.to(device), seqused_k=pg.seqlens.to(device), **kw,
            )  # fmt: skip
        return out, ref
    sq, lens = 3, [5, 64, 1, 100]  # three queries per sequence (a speculative step), caches of each length
    q = torch.randn(len(lens), sq, h, d, generator=gen).to(dtype)
    k = torch.randn(sum(lens), hk, d, generator=gen).to(dtype)
    v = torch.randn(sum(lens), hk, d, generator=gen).to(dtype)
    offs = [0, *torch.tensor(lens).cumsum(0).tolist()]
    ref = torch.stack(
        [
            attention_ref(q[i], k[offs[i] : offs[i + 1]], v[offs[i] : offs[i + 1]], causal=causal, window=window, softcap=softcap)
            for i in range(len(lens))
        ]
    )  # fmt: skip
    seqlens = torch.tensor(lens, dtype=torch.int32)
    if mode == "kv_paged":
        pg = paged(k, v, lens, 16, gen)
        caches, table = (pg.k_cache, pg.v_cache), pg.block_table.to(device)
    else:  # dense [B, S_k, H_kv, D], garbage past each sequence's keys
        kc, vc = (
            torch.randn(len(lens), 128, hk, d, generator=gen).to(dtype),
            torch.randn(len(lens), 128, hk, d, generator=gen).to(dtype),
        )
        for i, n in enumerate(lens):
            kc[i, :n], vc[i, :n] = k[offs[i] : offs[i + 1]], v[offs[i] : offs[i + 1]]
        caches, table = (kc, vc), None
    out = flash_attn_with_kvcache(
        q.to(device),
        caches[0].to(device),
        caches[1].to(device),
        cache_seqlens=seqlens.to(device),
        block_table=table,
        **kw,
    )
    return out, ref


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_cuda_matches_reference_and_cpu(case):
    mode, causal, window, softcap, d, ratio, dt = case
    dtype = DTYPES[dt]
    out, ref = _run_case(mode, causal, window, softcap, d, ratio, dtype)
    assert out.is_cuda and out.dtype == dtype and out.shape == ref.shape
    torch.testing.assert_close(out.cpu().double(), ref, **tolerance(dtype))
    cpu_out, _ = _run_case(mode, causal, window, softcap, d, ratio, dtype, device="cpu")
    torch.testing.assert_close(out.cpu().double(), cpu_out.double(), **_twin_tol(dtype))


@pytest.mark.parametrize("mode", ["varlen", "paged", "kv_paged"])
def test_num_splits_changes_nothing_on_cuda(mode):
    # split-K runs on the CPU only; on CUDA every num_splits must give the same bytes, and the reference
    outs = [_run_case(mode, True, (-1, -1), 0.0, 128, 4, torch.bfloat16, num_splits=n) for n in (0, 1, 4, 64)]
    for out, _ in outs[1:]:
        assert torch.equal(out, outs[0][0])
    torch.testing.assert_close(outs[0][0].cpu().double(), outs[0][1], **tolerance(torch.bfloat16))
    with pytest.raises(RuntimeError, match=r"keel_flash_attn::varlen_fwd: num_splits must be in \[0, 128\], got 200"):
        q = torch.randn(3, 2, 64, device="cuda")
        flash_attn_varlen_func(q, q, q, cu([3]).cuda(), cu([3]).cuda(), 3, 3, num_splits=200)


def test_side_stream():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(40, 4, 64, generator=gen)
    k, v = torch.randn(70, 2, 64, generator=gen), torch.randn(70, 2, 64, generator=gen)
    ref = varlen_ref(q, k, v, [40], [70], causal=True)
    big = torch.randn(4096, 4096, device="cuda")
    qc, kc, vc = q.cuda(), k.cuda(), v.cuda()
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        qq = qc + (big @ big)[:1, :1] * 0.0  # q is ready only after a long matmul queued first on `side`
        out = flash_attn_varlen_func(qq, kc, vc, cu([40]).cuda(), cu([70]).cuda(), 40, 70, causal=True)
    side.synchronize()
    torch.testing.assert_close(out.cpu().double(), ref, **tolerance(torch.float32))


def test_host_checks():
    q = torch.randn(6, 2, 64, device="cuda")
    cq = cu([1, 5]).cuda()
    with pytest.raises(
        RuntimeError, match=r"keel_flash_attn::varlen_fwd: max_seqlen_q = 2 is too small: q has 6 rows over 2 sequences"
    ):
        flash_attn_varlen_func(q, q, q, cq, cq, 2, 5)
    with pytest.raises(RuntimeError, match=r"keel_flash_attn::varlen_fwd: block_table must be a CUDA tensor, got cpu"):
        flash_attn_varlen_func(
            q,
            q.view(6, 1, 2, 64),
            q.view(6, 1, 2, 64),
            cq,
            None,
            5,
            5,
            block_table=torch.zeros(2, 6, dtype=torch.int32),
            seqused_k=cq[1:],
        )
    empty = flash_attn_varlen_func(torch.randn(6, 0, 64, device="cuda"), q, q, cq, cq, 5, 5)  # no query head
    assert empty.shape == (6, 0, 64)


def test_batch_above_grid_z_limit():
    # 70000 sequences of one key each: the batch lies on grid.x (gridDim.z stops at 65535); out = v's row
    b = 70000
    q = torch.randn(b, 1, 1, 8, device="cuda")
    kc, vc = torch.randn(b, 1, 1, 8, device="cuda"), torch.randn(b, 1, 1, 8, device="cuda")
    out = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=torch.ones(b, dtype=torch.int32, device="cuda"))
    torch.testing.assert_close(out, vc, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_devices_refused():
    q = torch.randn(1, 1, 2, 64, device="cuda:0")
    kc = torch.randn(4, 16, 2, 64, device="cuda:0")
    table = torch.zeros(1, 1, dtype=torch.int32, device="cuda:1")
    with pytest.raises(
        RuntimeError,
        match=r"keel_flash_attn::fwd_kvcache: block_table must be on the device of q \(cuda:0\), got cuda:1",
    ):
        flash_attn_with_kvcache(
            q, kc, kc, cache_seqlens=torch.ones(1, dtype=torch.int32, device="cuda:0"), block_table=table
        )


# Each child makes one call whose index data is bad where only the device reads it; the kernel must assert.
_CHILD = textwrap.dedent(
    """
    import json, sys, torch
    from keel.vendored.flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

    which = sys.argv[1]
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device="cuda")
    q = torch.randn(6, 2, 64, device="cuda")
    kc = torch.randn(4, 16, 2, 64, device="cuda")
    err = ""
    try:
        if which == "block":  # block id 9 of a 4-block cache
            flash_attn_with_kvcache(q.view(6, 1, 2, 64), kc, kc, cache_seqlens=i32([20] * 6), block_table=i32([[0, 9]] * 6))
        elif which == "column":  # 40 keys (max_seqlen_k 40), but each block_table row holds 2 blocks of 16
            flash_attn_varlen_func(q, kc, kc, i32([0, 3, 6]), None, 3, 40, block_table=i32([[0, 1], [2, 3]]),
                                   seqused_k=i32([40, 40]))
        elif which == "total_q":  # cu_seqlens_q ends at 4 of q's 6 rows: rows 4-5 would stay unwritten
            flash_attn_varlen_func(q, q, q, i32([0, 2, 4]), i32([0, 3, 6]), 3, 3)
        elif which == "max_q":  # a sequence of 5 queries with max_seqlen_q = 3 (6 rows fit 2 x 3: the host passes it)
            flash_attn_varlen_func(q, q, q, i32([0, 1, 6]), i32([0, 1, 6]), 3, 5)
        elif which == "max_k0":  # max_seqlen_k = 0 with sequences of 3 keys: the CPU refuses it on the host
            flash_attn_varlen_func(q, q, q, i32([0, 3, 6]), i32([0, 3, 6]), 3, 0)
        torch.cuda.synchronize()
    except RuntimeError as e:
        err = str(e)
    print(json.dumps({"error": err}))
    """
)
DEVICE_CHECKS = {
    "block": "a block_table entry is outside the paged cache",
    "column": "a sequence has more keys than its block_table row holds",
    "total_q": "cu_seqlens_q[-1] must be total_q",
    "max_q": "a sequence has more queries than max_seqlen_q",
    "max_k0": "exceed max_seqlen_k",
}


@pytest.mark.parametrize("which", sorted(DEVICE_CHECKS))
def test_device_check_asserts(which, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, which], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"child failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    assert "device-side assert" in json.loads(lines[-1])["error"], proc.stdout + proc.stderr
    assert DEVICE_CHECKS[which] in proc.stdout + proc.stderr
