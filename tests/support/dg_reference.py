"""fp64 references of the dequantized inputs, shared by the deep_gemm tests."""

from __future__ import annotations

import torch


def dequant_per_token(a: torch.Tensor, sfa: torch.Tensor, gran_k: int = 128) -> torch.Tensor:
    """a e4m3 [M, K] with scales [M, ceil(K/gran_k)] -> float64 [M, K]."""
    return a.double() * sfa.double().repeat_interleave(gran_k, dim=1)[:, : a.shape[1]]


def dequant_per_block(b: torch.Tensor, sfb: torch.Tensor) -> torch.Tensor:
    """b e4m3 [N, K] with scales [ceil(N/128), ceil(K/128)] -> float64 [N, K]."""
    s = sfb.double().repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)
    return b.double() * s[: b.shape[0], : b.shape[1]]


def fp8_reference(a, sfa, b, sfb, c=None) -> torch.Tensor:
    """c + A @ B.T in float64 from the dequantized inputs."""
    out = dequant_per_token(a, sfa) @ dequant_per_block(b, sfb).T
    return out if c is None else out + c.double()
