"""keel's DeepGEMM-style FP8 GEMM (vendored_deps/deep_gemm), in upstream DeepGEMM's Python call shape.

`fp8_gemm_nt((a, sfa), (b, sfb), d, c=None, recipe=None)` computes d = c + a @ b.T with block-scaled
e4m3 inputs, as `deep_gemm.fp8_gemm_nt` does. The registered schema (`torch.ops.keel_deep_gemm.*`) takes
the pairs as separate tensors and the recipe as three ints, because the stable dispatcher carries
neither tuples nor narrow scalars: the functions here re-pack upstream's tuples for it.
Importing this module loads the library; `import keel` does not.
"""

from __future__ import annotations

import torch

from keel.vendored.deep_gemm import _ops

_lib = torch.ops.keel_deep_gemm

__all__ = [
    "bf16_gemm_nt",
    "calc_diff",
    "fp8_gemm_nt",
    "per_block_cast_to_fp8",
    "per_token_cast_to_fp8",
]
LIBRARY = _ops.LIBRARY


def fp8_gemm_nt(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    d: torch.Tensor,
    c: torch.Tensor | None = None,
    recipe: tuple[int, int, int] | None = None,
    disable_ue8m0_cast: bool = False,
) -> None:
    """d = c + a @ b.T for a = (e4m3 [M, K], fp32 scales [M, ceil(K/128)]) and b = (e4m3 [N, K], fp32 scales):
    `recipe` (1, 128, 128) or None: one scale per 128 x 128 block of b, [ceil(N/128), ceil(K/128)];
    (1, 1, 128): one per 1 x 128 group of each row, [N, ceil(K/128)] (keel's FP8 linear default, made by
    `per_token_cast_to_fp8(w)`). d bf16/fp32 [M, N] is written in place."""
    (a_val, sfa), (b_val, sfb) = a, b
    rm, rn, rk = recipe if recipe is not None else (None, None, None)
    _lib.fp8_gemm_nt.default(a_val, sfa, b_val, sfb, d, c, rm, rn, rk, disable_ue8m0_cast)


def bf16_gemm_nt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None) -> None:
    """d = c + a @ b.T for bfloat16 a [M, K] and b [N, K]; d bf16/fp32 [M, N] is written in place."""
    _lib.bf16_gemm_nt.default(a, b, d, c)


def per_token_cast_to_fp8(
    x: torch.Tensor, use_ue8m0: bool = False, gran_k: int = 128
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 [M, K], fp32 scales [M, ceil(K/gran_k)]): scale = amax / 448 per 1 x gran_k group."""
    return _lib.per_token_cast_to_fp8.default(x, use_ue8m0, gran_k)


def per_block_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, K] -> (e4m3 [N, K], fp32 scales [ceil(N/128), ceil(K/128)]): scale = amax / 448 per 128 x 128 block."""
    return _lib.per_block_cast_to_fp8.default(x, use_ue8m0)


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's GEMM-output dissimilarity: 1 - 2<x, y> / (|x|^2 + |y|^2) in float64 (0 when equal)."""
    x64, y64 = x.detach().double(), y.detach().double()
    denominator = (x64 * x64 + y64 * y64).sum()
    return float(1.0 - 2.0 * (x64 * y64).sum() / denominator)
