#!/usr/bin/env python
"""Runs every keel op, and each vendored library's main op, once on real-sized data against plain torch.

  python scripts/release/demo_ops.py      # exit 1 when any op's error exceeds its bound

(The dtype column is the inputs'; fp8_gemm_nt casts them to e4m3 and writes bf16.)
Prints the torch version, the native libraries keel loaded (with sha256, to show that the same bytes serve
different torch releases), and per op the output shape, the max abs difference from a plain-torch
reference and that difference relative to the reference's max abs value, against a stated bound:

  keel ops and flash_attn: 1e-5 in float32, 1e-2 in bfloat16 (one bf16 rounding is 2^-8 = 3.9e-3 of a
  value; measured at most 4.8e-3);
  deep_gemm.fp8_gemm_nt against the matmul of its dequantized e4m3 operands in float64: 1e-2 (only the
  accumulation and the output's rounding differ), and against the unquantized matmul: 8e-2 (e4m3 keeps 3
  mantissa bits, 2^-4 of a value per operand; measured 3.0e-2 to 4.2e-2).
scripts/release/demo_generate.py (the pipeline's probe) runs `checks()` in each environment and the pipeline
fails a row on any op beyond its bound.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

import keel
from keel import ops

BOUNDS = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
FP8_DEQUANT_BOUND, FP8_BOUND = 1e-2, 8e-2


@dataclass(frozen=True)
class OpCheck:
    """One op's result against its plain-torch reference."""

    op: str
    device: str
    dtype: str
    shape: list[int]
    max_abs: float
    rel: float  # max_abs / max |reference|
    bound: float

    @property
    def ok(self) -> bool:
        return self.rel <= self.bound  # False for nan too

    def row(self) -> str:
        verdict = "ok" if self.ok else "EXCEEDED"
        return (
            f"| {self.op} | {self.device} | {self.dtype} | {self.shape} | {self.max_abs:.2e} | {self.rel:.1e} "
            f"| {self.bound:.0e} | {verdict} |"
        )


def _check(op: str, got: torch.Tensor, want: torch.Tensor, bound: float, dtype: torch.dtype | None = None) -> OpCheck:
    """`got` against `want`; `dtype` names the inputs' dtype when it is not the output's."""
    diff = (got.double() - want.double()).abs().max().item()
    rel = diff / max(want.double().abs().max().item(), 1e-30)
    name = str(dtype or got.dtype).removeprefix("torch.")
    return OpCheck(op, got.device.type, name, list(got.shape), diff, rel, bound)


def checks() -> list[OpCheck]:
    """Every op on SmolLM2-135M shapes (a 37-token prompt), CPU and CUDA when present, fp32 and bf16."""
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    g = torch.Generator().manual_seed(0)
    t, hidden, heads, kv, hs = 37, 576, 9, 3, 64
    out: list[OpCheck] = []
    for device in devices:
        for dtype in (torch.float32, torch.bfloat16):
            bound = BOUNDS[dtype]
            x = torch.randn(t, hidden, generator=g).to(device, dtype)
            w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(device, dtype)
            out.append(
                _check("fused_muladd", ops.fused_muladd(x, w.expand_as(x), 0.5), x.float() * w.float() + 0.5, bound)
            )
            want = F.rms_norm(x.float(), (hidden,), w.float(), 1e-5)
            out.append(_check("rms_norm", ops.rms_norm(x, w, 1e-5), want, bound))
            res = torch.randn(t, hidden, generator=g).to(device, dtype)
            xx, rr = x.clone(), res.clone()
            ops.fused_add_rms_norm(xx, rr, w, 1e-5)
            want = F.rms_norm((x + res).float(), (hidden,), w.float(), 1e-5)
            out.append(_check("fused_add_rms_norm", xx, want, bound))
            inv = 1.0 / (100000 ** (torch.arange(0, hs, 2).float() / hs))
            f = torch.outer(torch.arange(2048).float(), inv)
            cache = torch.cat([f.cos(), f.sin()], -1).to(device)
            pos = torch.arange(t, device=device)
            q = torch.randn(t, heads * hs, generator=g).to(device, dtype)
            k = torch.randn(t, kv * hs, generator=g).to(device, dtype)
            q0 = q.float().clone().view(t, heads, hs)
            ops.rotary_embedding(pos, q, k, hs, cache, True)
            c, s = cache[pos].chunk(2, -1)
            c, s = torch.cat([c, c], -1)[:, None], torch.cat([s, s], -1)[:, None]
            want = q0 * c + torch.cat([-q0[..., hs // 2 :], q0[..., : hs // 2]], -1) * s
            out.append(_check("rotary_embedding (q)", q, want.flatten(1), bound))
            gu = torch.randn(t, 2 * 1536, generator=g).to(device, dtype)
            want = F.silu(gu[:, :1536].float()) * gu[:, 1536:].float()
            out.append(_check("silu_and_mul", ops.silu_and_mul(gu), want, bound))
            out += vendored_checks(g, device, dtype)
    return out


def vendored_checks(g: torch.Generator, device: str, dtype: torch.dtype) -> list[OpCheck]:
    """deep_gemm's FP8 GEMM (SmolLM2's q_proj shape) and flash_attn's causal varlen attention (two
    sequences of 37 and 20 tokens, 9 q / 3 kv heads) against torch; loading them maps their libraries."""
    from keel.vendored import deep_gemm as dg
    from keel.vendored import flash_attn as fa

    x = torch.randn(37, 576, generator=g).to(device, dtype)
    w = torch.randn(576, 576, generator=g).to(device, dtype)
    d = torch.empty(37, 576, dtype=torch.bfloat16, device=device)
    (a, sfa), (b, sfb) = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(w)
    dg.fp8_gemm_nt((a, sfa), (b, sfb), d)
    a64 = a.double() * sfa.double().repeat_interleave(128, dim=1)[:, : a.shape[1]]
    s = sfb.double().repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)
    b64 = b.double() * s[: b.shape[0], : b.shape[1]]
    rows = [
        _check("deep_gemm.fp8_gemm_nt vs dequantized operands", d, a64 @ b64.T, FP8_DEQUANT_BOUND, dtype),
        _check("deep_gemm.fp8_gemm_nt vs unquantized", d, x.double() @ w.double().T, FP8_BOUND, dtype),
    ]
    lens = [37, 20]
    cu = torch.tensor([0, 37, 57], dtype=torch.int32, device=device)
    q = torch.randn(57, 9, 64, generator=g).to(device, dtype)
    k, v = (torch.randn(57, 3, 64, generator=g).to(device, dtype) for _ in range(2))
    out = fa.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    want = []
    for lo, n in zip((0, 37), lens, strict=True):
        qs, ks, vs = (t[lo : lo + n].float().transpose(0, 1) for t in (q, k, v))
        want.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True).transpose(0, 1))
    rows.append(_check("flash_attn.flash_attn_varlen_func", out, torch.cat(want), BOUNDS[dtype]))
    return rows


def table(results: list[OpCheck]) -> str:
    head = (
        "| op | device | dtype | output | max abs diff vs torch | relative to max abs of torch's | bound | |\n"
        "|---|---|---|---|---:|---:|---:|---|"
    )
    return "\n".join([head, *(r.row() for r in results)])


def as_json(results: list[OpCheck]) -> list[dict]:
    return [{**asdict(r), "ok": r.ok} for r in results]


def main() -> int:
    print(f"torch {torch.__version__} (cuda {torch.version.cuda}) | keel {keel.__version__}")
    for _name, path in sorted(keel._native.loaded_libraries().items()):
        print(f"  loaded {path}  sha256:{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}")
    results = checks()
    print("\n" + table(results))
    bad = [r for r in results if not r.ok]
    print(f"\n{len(results) - len(bad)}/{len(results)} ops within their bounds")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
