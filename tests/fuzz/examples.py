"""One valid call per fuzzed op, which the fuzz harness mutates: `EXAMPLES["ns::op"](rng, torch, device, dtype)`.

A vendored namespace adds its ops here (and its namespace to keel._oplist.NAMESPACES).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any


def _t(torch: Any, shape: tuple[int, ...], device: str, dtype: Any) -> Any:
    return torch.randn(shape).to(dtype).to(device)


def _cos_sin(torch: Any, max_pos: int, rot: int, device: str, dtype: Any) -> Any:
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2).float() / rot))
    f = torch.outer(torch.arange(max_pos).float(), inv)
    return torch.cat([f.cos(), f.sin()], -1).to(dtype).to(device)


def fused_muladd(rng: random.Random, torch: Any, device: str, dtype: Any) -> list[Any]:
    shape = tuple(rng.choice((1, 3, 8)) for _ in range(rng.randint(0, 3)))
    return [_t(torch, shape, device, dtype), _t(torch, shape, device, dtype), rng.choice((0.5, -2.0))]


def rms_norm(rng: random.Random, torch: Any, device: str, dtype: Any) -> list[Any]:
    h = rng.choice((1, 8, 64))
    return [_t(torch, (rng.choice((1, 3)), h), device, dtype), _t(torch, (h,), device, dtype), 1e-6]


def fused_add_rms_norm(rng: random.Random, torch: Any, device: str, dtype: Any) -> list[Any]:
    h = rng.choice((1, 8, 64))
    rows = rng.choice((1, 3))
    return [
        _t(torch, (rows, h), device, dtype),
        _t(torch, (rows, h), device, dtype),
        _t(torch, (h,), device, dtype),
        1e-5,
    ]


def rotary_embedding(rng: random.Random, torch: Any, device: str, dtype: Any) -> list[Any]:
    t, hs = rng.choice((1, 4)), rng.choice((8, 16))
    positions = torch.randint(0, 16, (t,)).to(device)
    qkv = _t(torch, (t, 4 * hs), device, dtype)
    q, k = (
        (qkv[:, : 2 * hs], qkv[:, 2 * hs :])
        if rng.random() < 0.5
        else (qkv[:, : 2 * hs].clone(), _t(torch, (t, hs), device, dtype))
    )
    return [positions, q, k, hs, _cos_sin(torch, 16, hs, device, torch.float32), rng.random() < 0.5]


def silu_and_mul(rng: random.Random, torch: Any, device: str, dtype: Any) -> list[Any]:
    return [_t(torch, (rng.choice((1, 3)), 2 * rng.choice((1, 8))), device, dtype)]


def reshape_and_cache(rng: random.Random, torch: Any, device: str, dtype: Any) -> list[Any]:
    t, kv, d, blocks, bs = rng.choice((1, 3)), 2, 8, 2, 4
    slots = torch.tensor(rng.sample(range(-1, blocks * bs), t)).to(device)
    return [
        _t(torch, (t, kv, d), device, dtype),
        _t(torch, (t, kv, d), device, dtype),
        torch.zeros(blocks, bs, kv, d, dtype=dtype, device=device),
        torch.zeros(blocks, bs, kv, d, dtype=dtype, device=device),
        slots,
    ]


def linear(rng: random.Random, torch: Any, device: str, dtype: Any) -> list[Any]:
    m, k, n = rng.choice((1, 4, 20)), rng.choice((1, 8, 32)), rng.choice((1, 8))
    bias = _t(torch, (n,), device, dtype) if rng.random() < 0.5 else None
    return [_t(torch, (m, k), device, dtype), _t(torch, (n, k), device, dtype), bias]


EXAMPLES: dict[str, Callable[[random.Random, Any, str, Any], list[Any]]] = {
    f"keel::{fn.__name__}": fn
    for fn in (fused_muladd, rms_norm, fused_add_rms_norm, rotary_embedding, silu_and_mul, reshape_and_cache, linear)
}
