"""One valid call per op of keel's own namespace, which the fuzzer mutates: `EXAMPLES["keel::op"](rng, device, dtype)`.

The vendored namespaces' examples are in examples_vendored.py; `all_examples()` merges them. An op that
is registered but has no example fails tests/fuzz/test_inventory.py.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from keel_fuzz.ops.cases import Example, t
from keel_fuzz.ops.examples_vendored import EXAMPLES as VENDORED


def _cos_sin(max_pos: int, rot: int, device: str, dtype: torch.dtype) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2).float() / rot))
    f = torch.outer(torch.arange(max_pos).float(), inv)
    return torch.cat([f.cos(), f.sin()], -1).to(dtype).to(device)


def fused_muladd(rng: random.Random, device: str, dtype: torch.dtype) -> list[Any]:
    shape = tuple(rng.choice((1, 3, 8)) for _ in range(rng.randint(0, 3)))
    return [t(shape, device, dtype), t(shape, device, dtype), rng.choice((0.5, -2.0))]


def rms_norm(rng: random.Random, device: str, dtype: torch.dtype) -> list[Any]:
    h = rng.choice((1, 8, 64))
    return [t((rng.choice((1, 3)), h), device, dtype), t((h,), device, dtype), 1e-6]


def fused_add_rms_norm(rng: random.Random, device: str, dtype: torch.dtype) -> list[Any]:
    h = rng.choice((1, 8, 64))
    rows = rng.choice((1, 3))
    return [t((rows, h), device, dtype), t((rows, h), device, dtype), t((h,), device, dtype), 1e-5]


def rotary_embedding(rng: random.Random, device: str, dtype: torch.dtype) -> list[Any]:
    n, hs = rng.choice((1, 4)), rng.choice((8, 16))
    positions = torch.randint(0, 16, (n,)).to(device)
    qkv = t((n, 4 * hs), device, dtype)
    q, k = (
        (qkv[:, : 2 * hs], qkv[:, 2 * hs :])
        if rng.random() < 0.5
        else (qkv[:, : 2 * hs].clone(), t((n, hs), device, dtype))
    )
    return [positions, q, k, hs, _cos_sin(16, hs, device, torch.float32), rng.random() < 0.5]


def silu_and_mul(rng: random.Random, device: str, dtype: torch.dtype) -> list[Any]:
    return [t((rng.choice((1, 3)), 2 * rng.choice((1, 8))), device, dtype)]


def reshape_and_cache(rng: random.Random, device: str, dtype: torch.dtype) -> list[Any]:
    n, kv, d, blocks, bs = rng.choice((1, 3)), 2, 8, 2, 4
    slots = torch.tensor(rng.sample(range(-1, blocks * bs), n)).to(device)
    return [
        t((n, kv, d), device, dtype),
        t((n, kv, d), device, dtype),
        torch.zeros(blocks, bs, kv, d, dtype=dtype, device=device),
        torch.zeros(blocks, bs, kv, d, dtype=dtype, device=device),
        slots,
    ]


def linear(rng: random.Random, device: str, dtype: torch.dtype) -> list[Any]:
    m, k, n = rng.choice((1, 4, 20)), rng.choice((1, 8, 32)), rng.choice((1, 8))
    bias = t((n,), device, dtype) if rng.random() < 0.5 else None
    return [t((m, k), device, dtype), t((n, k), device, dtype), bias]


def fp8_linear(rng: random.Random, device: str, dtype: torch.dtype) -> list[Any]:
    m, k, n = rng.choice((1, 4, 40)), rng.choice((1, 8, 130)), rng.choice((1, 8))
    rows = n if rng.random() < 0.5 else 1  # a scale per row, or one per 128 rows
    qweight = (torch.randn(n, k) * 8).to(torch.float8_e4m3fn).to(device)
    scale = (torch.rand(rows, (k + 127) // 128) + 0.5).to(device)
    bias = t((n,), device, dtype) if rng.random() < 0.5 else None
    special = torch.ops.keel.fp8_special_rows(qweight) if device == "cpu" and rng.random() < 0.5 else None
    return [t((m, k), device, dtype), qweight, scale, bias, special]


def fp8_special_rows(rng: random.Random, device: str, dtype: torch.dtype) -> list[Any]:
    n, k = rng.choice((1, 8, 40)), rng.choice((1, 8, 130))
    return [(torch.randn(n, k) * 8).to(torch.float8_e4m3fn).to(device)]


def _projection(rng: random.Random, n: int, k: int, device: str, dtype: torch.dtype) -> list[Any]:
    """A projection's four arguments: a float weight (+ bias), or an e4m3 one with scales (+ special rows)."""
    bias = t((n,), device, dtype) if rng.random() < 0.5 else None
    if rng.random() < 0.5:
        return [t((n, k), device, dtype), None, bias, None]
    qweight = (torch.randn(n, k) * 8).to(torch.float8_e4m3fn)
    special = torch.ops.keel.fp8_special_rows(qweight).to(device) if rng.random() < 0.5 else None
    return [qweight.to(device), (torch.rand(n, (k + 127) // 128) + 0.5).to(device), bias, special]


def layer_qkv(rng: random.Random, device: str, dtype: torch.dtype) -> list[Any]:
    n, hidden, heads, kv, d, blocks, bs = rng.choice((1, 3)), rng.choice((8, 32)), 2, 1, 8, 2, 4
    slots = torch.tensor(rng.sample(range(-1, blocks * bs), n)).to(device)
    x = t((n, hidden), device, dtype) if rng.random() < 0.5 else None
    norms = [t((d,), device, dtype), t((d,), device, dtype)] if rng.random() < 0.5 else [None, None]
    return [
        x, t((n, hidden), device, dtype), t((hidden,), device, dtype), 1e-5,
        *_projection(rng, (heads + 2 * kv) * d, hidden, device, dtype), *norms,
        torch.randint(0, 16, (n,)).to(device), _cos_sin(16, d, device, torch.float32), heads, kv,
        torch.zeros(blocks, bs, kv, d, dtype=dtype, device=device),
        torch.zeros(blocks, bs, kv, d, dtype=dtype, device=device), slots,
    ]  # fmt: skip


def layer_mlp(rng: random.Random, device: str, dtype: torch.dtype) -> list[Any]:
    n, k, hidden, inter = rng.choice((1, 3)), rng.choice((8, 16)), rng.choice((8, 32)), rng.choice((4, 12))
    return [
        t((n, k), device, dtype), t((n, hidden), device, dtype), *_projection(rng, hidden, k, device, dtype),
        t((hidden,), device, dtype), 1e-6, *_projection(rng, 2 * inter, hidden, device, dtype),
        *_projection(rng, hidden, inter, device, dtype),
    ]  # fmt: skip


EXAMPLES: dict[str, Example] = {
    f"keel::{fn.__name__}": fn
    for fn in (
        fused_muladd,
        rms_norm,
        fused_add_rms_norm,
        rotary_embedding,
        silu_and_mul,
        reshape_and_cache,
        linear,
        fp8_linear,
        fp8_special_rows,
        layer_qkv,
        layer_mlp,
    )
}


def all_examples() -> dict[str, Example]:
    """Every namespace's examples, by "namespace::op"."""
    return {**EXAMPLES, **VENDORED}
