#!/usr/bin/env python
"""Runs every keel op, and each vendored library's main op, once on real-sized data against plain torch.

Prints the torch version, the native libraries keel loaded (with sha256, to show that
the same bytes serve different torch releases), and per op the output shape and the
max abs difference from a plain-torch reference.
"""

from __future__ import annotations

import hashlib

import torch
import torch.nn.functional as F

import keel
from keel import ops


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def main() -> None:
    print(f"torch {torch.__version__} (cuda {torch.version.cuda}) | keel {keel.__version__}")
    for _name, path in sorted(keel._native.loaded_libraries().items()):
        print(f"  loaded {path}  sha256:{sha256(path)}")
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    g = torch.Generator().manual_seed(0)
    t, hidden, heads, kv, hs = 37, 576, 9, 3, 64  # SmolLM2-135M shapes, a 37-token prompt
    print(
        "\n| op | device | dtype | output | max abs diff vs torch | relative to max abs of torch's |\n"
        "|---|---|---|---|---:|---:|"
    )
    for device in devices:
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(t, hidden, generator=g).to(device, dtype)
            w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(device, dtype)
            rows = []
            out = ops.fused_muladd(x, w.expand_as(x), 0.5)
            rows.append(("fused_muladd", out, (x.float() * w.float() + 0.5)))
            out = ops.rms_norm(x, w, 1e-5)
            rows.append(("rms_norm", out, F.rms_norm(x.float(), (hidden,), w.float(), 1e-5)))
            res = torch.randn(t, hidden, generator=g).to(device, dtype)
            xx, rr = x.clone(), res.clone()
            ops.fused_add_rms_norm(xx, rr, w, 1e-5)
            rows.append(("fused_add_rms_norm", xx, F.rms_norm((x + res).float(), (hidden,), w.float(), 1e-5)))
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
            want_q = q0 * c + torch.cat([-q0[..., hs // 2 :], q0[..., : hs // 2]], -1) * s
            rows.append(("rotary_embedding (q)", q, want_q.flatten(1)))
            gu = torch.randn(t, 2 * 1536, generator=g).to(device, dtype)
            rows.append(("silu_and_mul", ops.silu_and_mul(gu), F.silu(gu[:, :1536].float()) * gu[:, 1536:].float()))
            rows += vendored_rows(g, device, dtype)
            for name, got, want in rows:
                diff = (got.float() - want.float()).abs().max().item()
                rel = diff / max(want.float().abs().max().item(), 1e-30)
                print(f"| {name} | {device} | {str(dtype)[6:]} | {list(got.shape)} | {diff:.2e} | {rel:.1e} |")


def vendored_rows(g: torch.Generator, device: str, dtype: torch.dtype) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """deep_gemm's FP8 GEMM (SmolLM2's q_proj shape) and flash_attn's causal varlen attention (two
    sequences of 37 and 20 tokens, 9 q / 3 kv heads) against torch; loading them maps their libraries."""
    from keel.vendored import deep_gemm as dg
    from keel.vendored import flash_attn as fa

    x = torch.randn(37, 576, generator=g).to(device, dtype)
    w = torch.randn(576, 576, generator=g).to(device, dtype)
    d = torch.empty(37, 576, dtype=torch.bfloat16, device=device)
    dg.fp8_gemm_nt(dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(w), d)
    rows = [("deep_gemm.fp8_gemm_nt (e4m3)", d, x.float() @ w.float().T)]
    lens = [37, 20]
    cu = torch.tensor([0, 37, 57], dtype=torch.int32, device=device)
    q = torch.randn(57, 9, 64, generator=g).to(device, dtype)
    k, v = (torch.randn(57, 3, 64, generator=g).to(device, dtype) for _ in range(2))
    out = fa.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    want = []
    for lo, n in zip((0, 37), lens, strict=True):
        qs, ks, vs = (t[lo : lo + n].float().transpose(0, 1) for t in (q, k, v))
        want.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True).transpose(0, 1))
    rows.append(("flash_attn.flash_attn_varlen_func", out, torch.cat(want)))
    return rows


if __name__ == "__main__":
    main()
