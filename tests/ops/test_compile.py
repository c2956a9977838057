"""Every keel op inside one torch.compile(fullgraph=True) graph, checked against eager."""

from __future__ import annotations

import pytest
import torch

from keel import ops
from keel._oplist import KEEL_OPS


def block(x, residual, w, positions, cache, wqkv, bias, k_cache, v_cache, slots, w8, w8_scale):
    """A decoder-layer-shaped use of every op (linear, fp8_linear, norms, rotary, cache write, activation, muladd)."""
    h = ops.rms_norm(x, w, 1e-6)
    qkv = ops.linear(h, wqkv, bias)  # [T, 32 + 16 + 16]
    q = qkv[:, :32].clone()
    k = qkv[:, 32:48].clone()
    v = qkv[:, 48:].clone()
    ops.rotary_embedding(positions, q, k, 8, cache, True)
    ops.reshape_and_cache(k.view(-1, 2, 8), v.view(-1, 2, 8), k_cache, v_cache, slots)
    act = ops.silu_and_mul(torch.cat([q, k], dim=-1))
    y = ops.fused_muladd(act, act, 0.5)
    o8 = ops.fp8_linear(h, w8, w8_scale, None, ops.fp8_special_rows(w8))  # [T, 8], an FP8 projection
    # the layer step: q from the input norm, projection and rotary (cache written again), then the MLP on it
    q2 = ops.layer_qkv(None, h.clone(), w, 1e-6, (wqkv, None, bias, None), None, None, positions, cache, 4, 2, k_cache,
                       v_cache, slots)  # fmt: skip
    half = (wqkv[:, :32], None, None, None)
    m = ops.layer_mlp(q2.view(-1, 32), h.clone(), half, w, 1e-6, (wqkv, None, bias, None), half)
    x2 = x + y.sum(-1, keepdim=True) + k_cache.sum() + v_cache.sum() + o8.sum(-1, keepdim=True) + m
    ops.fused_add_rms_norm(x2, residual, w, 1e-6)
    return x2, residual, k_cache, v_cache


def _inputs():
    g = torch.Generator().manual_seed(0)
    inv = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
    freqs = torch.outer(torch.arange(16).float(), inv)
    cache = torch.cat([freqs.cos(), freqs.sin()], -1)
    return (
        torch.randn(5, 64, generator=g),
        torch.randn(5, 64, generator=g),
        torch.randn(64, generator=g),
        torch.arange(5),
        cache,
        torch.randn(64, 64, generator=g) * 0.1,
        torch.randn(64, generator=g),
        torch.zeros(3, 4, 2, 8),
        torch.zeros(3, 4, 2, 8),
        torch.tensor([0, 5, -1, 6, 11]),
        (torch.randn(8, 64, generator=g) * 8).to(torch.float8_e4m3fn),
        torch.rand(8, 1, generator=g) * 0.01 + 0.001,
    )


def test_block_uses_every_op():
    names = {n for n in KEEL_OPS if f"ops.{n}(" in open(__file__).read().split("def _inputs")[0]}
    assert names == set(KEEL_OPS)


@pytest.mark.slow  # torch.compile: inductor generates and compiles C++ for the graph (a native build)
def test_fullgraph_compile_matches_eager():
    torch._dynamo.reset()
    eager_in = _inputs()
    compiled_in = _inputs()
    want = block(*eager_in)
    got = torch.compile(block, fullgraph=True)(*compiled_in)
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w)
    assert bool(want[2].abs().sum() > 0)  # the cache write happened
