"""The --device cuda halves of benchmarks/gemm.py, attention.py and ops.py: keel's CUDA kernels against
the GPU peers, timed with CUDA events, peers alternated in every repeat, the best repeat kept. No GPU run is
recorded in docs/measurements/ yet: the GPU check (scripts/device/check.sh, docs/device.md) runs it.

    gemm       fp8_gemm_nt (1x128 and 128x128 weight scales) vs torch._scaled_mm FP8 (row-wise scales; a private
               torch API, used only here in benchmarks/, with torch's bf16 matmul as the public fallback peer) and
               torch bf16 matmul; bf16_gemm_nt vs torch bf16 matmul; the casts vs a device copy. TFLOP/s, GB/s.
    attention  flash_attn_with_kvcache (paged, decode) and flash_attn_varlen_func (causal prefill) vs SDPA with
               only its flash backend allowed, on a contiguous cache (K/V expanded for GQA outside the timing).
    ops        each keel op's GB/s (bytes read + written) vs a device copy of the same bytes.

Every benchmark first checks keel's result against the peer's (a benchmark of wrong results is worthless).
--dry-run runs the same code on CPU tensors at toy sizes, one repeat: it checks the script, not speed.
--json PATH writes rows plus "figures" (one line per CUDA path, read by scripts/device/check.py) after every case,
--time-cap S stops adding cases after S seconds (the device check passes a cap well inside its step).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from keel_dev.timing import best_times

Fn = Callable[[], object]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options bench_gemm / bench_attention / bench_ops add for their CUDA half."""
    p.add_argument("--dry-run", action="store_true", help="with --device cuda: the CUDA code on CPU tensors, toy sizes")
    p.add_argument("--json", type=Path, default=None, help="also write the rows and figures as JSON")
    p.add_argument(
        "--time-cap", type=float, default=60.0, help="with --device cuda: stop adding cases after this many s"
    )


class Clock:
    """The benchmark's own time cap: cases run cheapest first, and the rest are skipped (and said so) past it."""

    def __init__(self, cap_s: float, notes: dict[str, str]) -> None:
        self.t0, self.cap, self.notes, self.skipped = time.monotonic(), cap_s, notes, 0

    def over(self) -> bool:
        if time.monotonic() - self.t0 <= self.cap:
            return False
        self.skipped += 1
        self.notes["time cap"] = f"{self.skipped} case(s) skipped past the {self.cap:.0f} s cap"
        return True


def try_peer(name: str, fn: Fn, notes: dict[str, str]) -> Fn | None:
    """fn if one call works, else None with the reason in notes (a peer this torch or GPU lacks)."""
    try:
        fn()
        return fn
    except Exception as e:  # noqa: BLE001 - the reason is the result
        notes[name] = f"unavailable: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
        return None


def spread(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f}x (range {min(ratios):.2f}-{max(ratios):.2f}x)" if ratios else "n/a"


def write(
    args: argparse.Namespace,
    kind: str,
    rows: list[dict],
    figures: dict[str, str],
    notes: dict[str, str],
    partial: bool = False,
) -> None:
    """The JSON (after every case, `partial`: a killed run still leaves the cases it finished) and, at the end,
    the printed table."""
    device = "cpu (dry run)" if args.dry_run else torch.cuda.get_device_name(0)
    if not partial:
        print(f"\n{kind} on {device}, torch {torch.__version__}")
        for r in rows:
            print("  " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()))
        for k, v in {**figures, **notes}.items():
            print(f"{k}: {v}")
    if args.dry_run:  # no reader may take these for speeds
        figures = {k: f"dry run (CPU tensors, toy sizes; not a speed): {v}" for k, v in figures.items()}
    if args.json:
        payload = {"kind": kind, "device": device, "torch": torch.__version__, "dry_run": args.dry_run}
        payload["complete"] = not partial
        tmp = args.json.with_suffix(".tmp")  # written whole, then renamed: never a half-written file
        tmp.write_text(json.dumps({**payload, "rows": rows, "figures": figures, "notes": notes}, indent=1))
        tmp.replace(args.json)


def _device(args: argparse.Namespace) -> str:
    if args.dry_run:
        return "cpu"
    if not torch.cuda.is_available():
        raise SystemExit("--device cuda needs a CUDA GPU (use --dry-run to check the script without one)")
    return "cuda"


def _gemm_case(n: int, k: int, m: int, dev: str, notes: dict[str, str]) -> dict[str, Fn]:
    """The peers of one x [m, k] @ w[n, k].T, after checking keel's FP8 result against torch's bf16 one."""
    from keel.vendored import deep_gemm as dg

    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
    rows_w, blocks_w = dg.per_token_cast_to_fp8(w), dg.per_block_cast_to_fp8(w)
    wt = w.to(torch.float8_e4m3fn)  # per-tensor e4m3 for _scaled_mm (w's values fit without a scale)
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    a = dg.per_token_cast_to_fp8(x)
    d = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
    xs = x.float().abs().amax(1, keepdim=True).clamp(min=1e-4) / 448
    xq = (x.float() / xs).to(torch.float8_e4m3fn)
    one = torch.ones(1, n, device=dev)
    fns: dict[str, Fn] = {
        "fp8 1x128": lambda: dg.fp8_gemm_nt(a, rows_w, d, recipe=(1, 1, 128)),
        "fp8 128x128": lambda: dg.fp8_gemm_nt(a, blocks_w, d, recipe=(1, 128, 128)),
        "keel bf16_gemm_nt": lambda: dg.bf16_gemm_nt(x, w, d),
        "torch bf16": lambda: x @ w.T,
        "cast 1x128": lambda: dg.per_token_cast_to_fp8(x),
    }
    peer = try_peer(
        "torch._scaled_mm",
        lambda: torch._scaled_mm(xq, wt.t(), scale_a=xs, scale_b=one, out_dtype=torch.bfloat16),
        notes,
    )
    if peer is not None:
        fns["torch._scaled_mm"] = peer
    fns["fp8 1x128"]()
    assert dg.calc_diff(d.float(), (x @ w.T).float()) < 2e-3, f"fp8_gemm_nt is wrong at {m}x{n}x{k}"
    return fns


def gemm_main(args: argparse.Namespace) -> None:
    dev = _device(args)
    shapes = [(256, 256)] if args.dry_run else [(960, 576), (49152, 576), (4096, 4096), (14336, 4096), (4096, 14336)]
    ms = [1, 4] if args.dry_run else [1, 16, 128, 1024]
    cases = sorted(((n, k, m) for n, k in shapes for m in ms), key=lambda c: c[0] * c[1] * c[2])
    rows: list[dict] = []
    notes: dict[str, str] = {}
    clock = Clock(args.time_cap, notes)
    r_fp8, r_bf16, cast_gbs = [], [], []

    def figures_now() -> dict[str, str]:
        best = max((r["fp8 TFLOP/s"] for r in rows), default=0.0)
        fp8_peer = "torch._scaled_mm FP8" if "torch._scaled_mm" not in notes else "torch bf16 (scaled_mm unavailable)"
        return {
            "deep_gemm fp8_gemm_nt": f"best {best:.2f} TFLOP/s; vs {fp8_peer}: {spread(r_fp8)} (> 1: keel faster)",
            "deep_gemm bf16_gemm_nt": f"speed vs torch bf16 matmul: {spread(r_bf16)}",
            "deep_gemm casts": f"per-token cast {statistics.median(cast_gbs or [0.0]):.1f} GB/s (median over shapes)",
        }

    for n, k, m in cases:
        if clock.over():
            continue
        flop = 2.0 * m * n * k
        repeats, inner = (1, 1) if args.dry_run else (3, max(1, min(20, int(5e10 // flop))))
        t = best_times(_gemm_case(n, k, m, dev, notes), repeats=repeats, inner=inner, device=dev)
        row = {"m": m, "n": n, "k": k, **{f"{name} us": v * 1e6 for name, v in t.items()}}
        row["fp8 TFLOP/s"] = flop / t["fp8 1x128"] / 1e12
        fp8_peer = "torch._scaled_mm" if "torch._scaled_mm" in t else "torch bf16"
        r_fp8.append(t[fp8_peer] / t["fp8 1x128"])
        r_bf16.append(t["torch bf16"] / t["keel bf16_gemm_nt"])
        cast_gbs.append((3 * m * k + 4 * m * ((k + 127) // 128)) / t["cast 1x128"] / 1e9)
        row["fp8 / peer"] = r_fp8[-1]
        rows.append(row)
        write(args, "gemm", rows, figures_now(), notes, partial=True)
    write(args, "gemm", rows, figures_now(), notes)


def _sdpa_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _decode_case(h: int, hk: int, d: int, batch: int, ctx: int, dev: str, notes: dict[str, str]) -> dict[str, Fn]:
    from keel.vendored.flash_attn import flash_attn_with_kvcache

    dt, nb = torch.bfloat16, batch * ctx // 16
    kc, vc = (torch.randn(nb, 16, hk, d, device=dev, dtype=dt) for _ in range(2))
    table = torch.randperm(nb, device=dev).view(batch, -1).to(torch.int32)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
    q = torch.randn(batch, 1, h, d, device=dev, dtype=dt)

    def dense(c: torch.Tensor) -> torch.Tensor:  # [B, H, L, D], kv heads expanded (outside the timing)
        return c[table.long()].view(batch, ctx, hk, d).transpose(1, 2).repeat_interleave(h // hk, 1).contiguous()

    kd, vd, qd = dense(kc), dense(vc), q.transpose(1, 2)
    fns: dict[str, Fn] = {"keel": lambda: flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table)}
    peer = try_peer("sdpa flash (decode)", lambda: _sdpa_flash(qd, kd, vd, False), notes)
    if peer is not None:
        diff = (fns["keel"]().float().transpose(1, 2) - peer().float()).abs().max().item()  # type: ignore[attr-defined]
        assert diff < 2e-2, f"flash_attn decode differs from SDPA by {diff}"
        fns["sdpa flash"] = peer
    return fns


def _prefill_case(h: int, hk: int, d: int, lens_q: list[int], dev: str, notes: dict[str, str]) -> dict[str, Fn]:
    from keel.vendored.flash_attn import flash_attn_varlen_func

    dt, total = torch.bfloat16, sum(lens_q)
    q, k, v = (torch.randn(total, n, d, device=dev, dtype=dt) for n in (h, hk, hk))
    cu = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    bounds = cu.tolist()
    ke, ve = k.repeat_interleave(h // hk, 1), v.repeat_interleave(h // hk, 1)
    seqs = [
        tuple(t[s:e].transpose(0, 1).unsqueeze(0) for t in (q, ke, ve))
        for s, e in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    fns: dict[str, Fn] = {
        "keel": lambda: flash_attn_varlen_func(q, k, v, cu, cu, max(lens_q), max(lens_q), causal=True)
    }
    peer = try_peer("sdpa flash (prefill)", lambda: [_sdpa_flash(*sq, True) for sq in seqs], notes)
    if peer is not None:
        got = fns["keel"]()[: lens_q[0]].float()  # type: ignore[index]
        want = _sdpa_flash(*seqs[0], True)[0].transpose(0, 1).float()
        assert (got - want).abs().max().item() < 2e-2, "flash_attn prefill differs from SDPA"
        fns["sdpa flash"] = peer
    return fns


def attention_main(args: argparse.Namespace) -> None:
    dev = _device(args)
    shapes = [(9, 3, 64), (32, 8, 128)]  # SmolLM2-135M, an 8B model
    decode = [(2, 64)] if args.dry_run else [(8, 1024), (32, 4096), (1, 16384)]
    prefill = [[48]] if args.dry_run else [[512, 1024, 256], [4096]]
    repeats, inner = (1, 1) if args.dry_run else (5, 10)
    rows: list[dict] = []
    notes: dict[str, str] = {}
    clock = Clock(args.time_cap, notes)
    ratios: dict[str, list[float]] = {"decode": [], "prefill": []}
    cases = [("decode", sh, c) for c in decode for sh in shapes] + [
        ("prefill", sh, c) for c in prefill for sh in shapes
    ]

    def figures_now() -> dict[str, str]:
        return {
            "flash_attn kvcache paged": f"decode speed vs SDPA flash: {spread(ratios['decode'])} (> 1: keel faster)",
            "flash_attn varlen": f"causal prefill speed vs SDPA flash: {spread(ratios['prefill'])}",
        }

    for kind, (h, hk, d), case in cases:
        if clock.over():
            continue
        if kind == "decode":
            fns = _decode_case(h, hk, d, case[0], case[1], dev, notes)
        else:
            fns = _prefill_case(h, hk, d, list(case), dev, notes)
        t = best_times(fns, repeats=repeats, inner=inner if kind == "decode" else max(1, inner // 4), device=dev)
        if "sdpa flash" in t:
            ratios[kind].append(t["sdpa flash"] / t["keel"])
        rows.append({"case": f"{kind} h{h}/{hk} d{d} {case}", **{f"{k} us": v * 1e6 for k, v in t.items()}})
        write(args, "attention", rows, figures_now(), notes, partial=True)
    write(args, "attention", rows, figures_now(), notes)


def ops_main(args: argparse.Namespace) -> None:
    from keel import ops

    dev = _device(args)
    rows_, hidden = (64, 256) if args.dry_run else (8192, 4096)
    repeats, inner = (1, 1) if args.dry_run else (5, 20)
    dt = torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape: int, dtype: torch.dtype = dt) -> torch.Tensor:
        return torch.randn(*shape, device=dev, dtype=dtype, generator=g)

    x, res, w = rand(rows_, hidden), rand(rows_, hidden), rand(hidden)
    a32, b32 = rand(rows_ * hidden, dtype=torch.float32), rand(rows_ * hidden, dtype=torch.float32)
    gu = rand(rows_, 2 * hidden)
    heads, kv, hs = 32, 8, 128
    qk = rand(rows_, (heads + kv) * hs)
    q, k = qk[:, : heads * hs], qk[:, heads * hs :]
    pos = torch.randint(0, 4096, (rows_,), device=dev)
    inv = 1.0 / (10000 ** (torch.arange(0, hs, 2, device=dev, dtype=torch.float32) / hs))
    f = torch.outer(torch.arange(4096, device=dev, dtype=torch.float32), inv)
    cache = torch.cat([f.cos(), f.sin()], -1)
    key, val = rand(rows_, kv, hs), rand(rows_, kv, hs)
    kc, vc = (
        torch.empty(rows_ // 16 + 1, 16, kv, hs, device=dev, dtype=dt),
        torch.empty(rows_ // 16 + 1, 16, kv, hs, device=dev, dtype=dt),
    )
    slots = torch.randperm(rows_, device=dev)
    el = 2
    cases: dict[str, tuple[Fn, int]] = {  # name: (keel call, bytes it reads + writes)
        "keel::fused_muladd": (lambda: ops.fused_muladd(a32, b32, 0.5), 3 * a32.numel() * 4),
        "keel::rms_norm": (lambda: ops.rms_norm(x, w, 1e-6), 2 * x.numel() * el),
        "keel::fused_add_rms_norm": (lambda: ops.fused_add_rms_norm(x, res, w, 1e-6), 4 * x.numel() * el),
        "keel::silu_and_mul": (lambda: ops.silu_and_mul(gu), 3 * x.numel() * el),
        "keel::rotary_embedding": (lambda: ops.rotary_embedding(pos, q, k, hs, cache, True), 2 * qk.numel() * el),
        "keel::reshape_and_cache": (lambda: ops.reshape_and_cache(key, val, kc, vc, slots), 4 * key.numel() * el),
    }  # fmt: skip
    torch.testing.assert_close(
        ops.rms_norm(x, w, 1e-6).float(), F.rms_norm(x.float(), (hidden,), w.float(), 1e-6), atol=5e-2, rtol=5e-2
    )
    torch.testing.assert_close(
        ops.silu_and_mul(gu).float(), (F.silu(gu[:, :hidden].float()) * gu[:, hidden:].float()), atol=5e-2, rtol=5e-2
    )
    rows, figures, notes = [], {}, {}
    clock = Clock(args.time_cap, notes)
    for name, (fn, moved) in cases.items():
        if clock.over():
            continue
        src = torch.empty(moved // 2, device=dev, dtype=torch.uint8)  # a copy reads and writes moved / 2 bytes each
        dst = torch.empty_like(src)
        t = best_times(
            {"keel": fn, "device copy": lambda d=dst, s=src: d.copy_(s)}, repeats=repeats, inner=inner, device=dev
        )
        gbs, copy_gbs = moved / t["keel"] / 1e9, moved / t["device copy"] / 1e9
        rows.append({"op": name, "keel GB/s": gbs, "copy GB/s": copy_gbs, "keel / copy": gbs / copy_gbs})
        figures[name] = f"{gbs:.0f} GB/s = {gbs / copy_gbs:.2f}x a device copy of the same bytes"
        write(args, "ops", rows, figures, notes, partial=True)
    write(args, "ops", rows, figures, notes)
