"""Plain-torch references of keel's ops (vLLM semantics): the oracle for tests, never used by the engine."""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (out * weight.float()).to(x.dtype)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    residual.add_(x)
    x.copy_(rms_norm(residual, weight, eps))


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, head_size: int,
                     cos_sin_cache: torch.Tensor, is_neox: bool) -> None:
    assert is_neox
    cos, sin = cos_sin_cache[positions].float().chunk(2, dim=-1)  # [T, D/2] each
    for t in (q, k):
        view = t.view(t.shape[0], -1, head_size)  # [T, heads, D]
        x1, x2 = view.float().chunk(2, dim=-1)
        c, s = cos[:, None, :], sin[:, None, :]
        view.copy_(torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(t.dtype))


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return torch.nn.functional.silu(x[..., :d]) * x[..., d:]


def fused_muladd(a: torch.Tensor, b: torch.Tensor, c: float) -> torch.Tensor:
    return a * b + c
