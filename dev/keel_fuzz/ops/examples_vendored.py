"""One valid call per op of the vendored namespaces (keel_deep_gemm, keel_flash_attn), for the fuzzer.

Each builds what a caller of the library builds: e4m3 operands with their fp32 scales in both of
DeepGEMM's recipes, packed and paged attention batches with ragged lengths, GQA, windows and softcap.
"""

from __future__ import annotations

import math
import random
from typing import Any

import torch

from keel_fuzz.ops.cases import Example, t


def _ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def _e4m3(shape: tuple[int, ...], device: str) -> torch.Tensor:
    return (torch.randn(shape) * 8).to(torch.float8_e4m3fn).to(device)


def _scales(shape: tuple[int, ...], device: str) -> torch.Tensor:
    return (torch.rand(shape) + 0.01).to(device)


def _gemm_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype == torch.float16 else dtype  # the GEMMs write bf16 or fp32


def fp8_gemm_nt(rng: random.Random, device: str, dtype: torch.dtype) -> list[Any]:
    m, n, k = rng.choice((1, 4)), rng.choice((1, 8, 130)), rng.choice((1, 64, 130, 256))
    recipe = rng.choice((None, (1, 128, 128), (1, 1, 128)))
    gran_n = 128 if recipe is None else recipe[1]
    out = _gemm_dtype(dtype)
    c = t((m, n), device, rng.choice((torch.bfloat16, torch.float32))) if rng.random() < 0.3 else None
    rm, rn, rk = recipe if recipe is not None else (None, None, None)
    return [
        _e4m3((m, k), device),
        _scales((m, _ceil_div(k, 128)), device),
        _e4m3((n, k), device),
        _scales((_ceil_div(n, gran_n), _ceil_div(k, 128)), device),
        torch.empty(m, n, dtype=out, device=device),
        c,
        rm,
        rn,
        rk,
        rng.random() < 0.5,
    ]


def bf16_gemm_nt(rng: random.Random, device: str, dtype: torch.dtype) -> list[Any]:
    m, n, k = rng.choice((1, 4)), rng.choice((1, 8, 130)), rng.choice((1, 64, 130))
    c = t((m, n), device, rng.choice((torch.bfloat16, torch.float32))) if rng.random() < 0.3 else None
    return [
        t((m, k), device, torch.bfloat16),
        t((n, k), device, torch.bfloat16),
        torch.empty(m, n, dtype=_gemm_dtype(dtype), device=device),
        c,
    ]


def per_token_cast_to_fp8(rng: random.Random, device: str, dtype: torch.dtype) -> list[Any]:
    shape = (rng.choice((1, 3, 8)), rng.choice((1, 100, 128, 300)))
    return [t(shape, device, _gemm_dtype(dtype)), rng.random() < 0.5, rng.choice((128, 64, 32))]


def per_block_cast_to_fp8(rng: random.Random, device: str, dtype: torch.dtype) -> list[Any]:
    shape = (rng.choice((1, 3, 130)), rng.choice((1, 100, 300)))
    return [t(shape, device, _gemm_dtype(dtype)), rng.random() < 0.5]


def _heads(rng: random.Random) -> tuple[int, int, int]:
    """(query heads, kv heads, head dim): MHA, GQA and MQA."""
    h_k = rng.choice((1, 2))
    return h_k * rng.choice((1, 2, 3)), h_k, rng.choice((8, 16, 64))


def _paged(
    rng: random.Random, lens_k: list[int], h_k: int, d: int, device: str, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Paged caches [num_blocks, block_size, h_k, d] and a shuffled block table [B, max_blocks] int32."""
    bs = rng.choice((1, 4, 16))
    need = [_ceil_div(n, bs) for n in lens_k]
    width = max([*need, 1])
    blocks = sum(need) + 2
    order = rng.sample(range(blocks), blocks)
    table = torch.zeros(len(lens_k), width, dtype=torch.int32)
    used = 0
    for i, n in enumerate(need):
        table[i, :n] = torch.tensor(order[used : used + n], dtype=torch.int32)
        used += n
    return t((blocks, bs, h_k, d), device, dtype), t((blocks, bs, h_k, d), device, dtype), table.to(device)


def _options(rng: random.Random, d: int) -> list[Any]:
    """softmax_scale, causal, window_left, window_right, softcap, num_splits."""
    left, right = rng.choice(((-1, -1), (2, 0), (3, 1)))
    return [1 / math.sqrt(d), rng.random() < 0.5, left, right, rng.choice((0.0, 5.0)), rng.choice((0, 1, 3))]


def varlen_fwd(rng: random.Random, device: str, dtype: torch.dtype) -> list[Any]:
    h, h_k, d = _heads(rng)
    lens_q = [rng.randint(0, 6) for _ in range(rng.randint(1, 3))]
    lens_k = [n + rng.choice((0, 0, 3)) for n in lens_q]
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    q = t((sum(lens_q), h, d), device, dtype)
    if rng.random() < 0.5:
        k, v = t((sum(lens_k), h_k, d), device, dtype), t((sum(lens_k), h_k, d), device, dtype)
        cu_seqlens_k, seqused_k, table = cu_k.to(device), None, None
    else:
        k, v, table = _paged(rng, lens_k, h_k, d, device, dtype)
        seqused_k = torch.tensor(lens_k, dtype=torch.int32).to(device)
        cu_seqlens_k = None
    mq, mk = max(lens_q) + rng.choice((0, 2)), max(lens_k) + rng.choice((0, 2))
    return [q, k, v, cu_q.to(device), cu_seqlens_k, seqused_k, table, mq, mk, *_options(rng, d)]


def fwd_kvcache(rng: random.Random, device: str, dtype: torch.dtype) -> list[Any]:
    h, h_k, d = _heads(rng)
    b, sq = rng.randint(1, 3), rng.choice((1, 1, 2))
    lens = [rng.randint(sq, 20) for _ in range(b)]
    q = t((b, sq, h, d), device, dtype)
    if rng.random() < 0.6:
        k_cache, v_cache, table = _paged(rng, lens, h_k, d, device, dtype)
    else:
        cap = max(lens) + rng.choice((0, 3))
        k_cache, v_cache, table = t((b, cap, h_k, d), device, dtype), t((b, cap, h_k, d), device, dtype), None
    seqlens = torch.tensor(lens, dtype=torch.int32).to(device) if table is not None or rng.random() < 0.7 else None
    return [q, k_cache, v_cache, seqlens, table, *_options(rng, d)]


def cpu_isa(rng: random.Random, device: str, dtype: torch.dtype) -> list[Any]:
    return [torch.empty(0, dtype=dtype, device=device)]


def last_splitkv_stats(rng: random.Random, device: str, dtype: torch.dtype) -> list[Any]:
    return [torch.empty(0, dtype=dtype, device=device)]


EXAMPLES: dict[str, Example] = {
    **{f"keel_deep_gemm::{fn.__name__}": fn for fn in (fp8_gemm_nt, bf16_gemm_nt, per_token_cast_to_fp8)},
    "keel_deep_gemm::per_block_cast_to_fp8": per_block_cast_to_fp8,
    **{f"keel_flash_attn::{fn.__name__}": fn for fn in (varlen_fwd, fwd_kvcache, cpu_isa, last_splitkv_stats)},
}
