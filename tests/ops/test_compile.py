"""All keel ops inside one torch.compile(fullgraph=True) graph, checked against eager."""

from __future__ import annotations

import torch

from keel import ops


def block(x, residual, w, positions, cache, gate_up):
    """A decoder-layer-shaped use of every op (norms, rotary, activation, muladd)."""
    h = ops.rms_norm(x, w, 1e-6)
    q = h[:, :32].clone()
    k = h[:, 32:48].clone()
    ops.rotary_embedding(positions, q, k, 8, cache, True)
    act = ops.silu_and_mul(gate_up)
    y = ops.fused_muladd(act, act, 0.5)
    x2 = x + torch.cat([q, k], dim=-1).sum(-1, keepdim=True) + y.sum(-1, keepdim=True)
    ops.fused_add_rms_norm(x2, residual, w, 1e-6)
    return x2, residual


def _inputs():
    g = torch.Generator().manual_seed(0)
    inv = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
    freqs = torch.outer(torch.arange(16).float(), inv)
    cache = torch.cat([freqs.cos(), freqs.sin()], -1)
    return (torch.randn(5, 64, generator=g), torch.randn(5, 64, generator=g), torch.randn(64, generator=g),
            torch.arange(5), cache, torch.randn(5, 24, generator=g))


def test_fullgraph_compile_matches_eager():
    torch._dynamo.reset()
    eager_in = _inputs()
    compiled_in = _inputs()
    want = block(*eager_in)
    got = torch.compile(block, fullgraph=True)(*compiled_in)
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w)
