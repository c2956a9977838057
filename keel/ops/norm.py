"""Normalization ops: rms_norm and fused_add_rms_norm."""

from __future__ import annotations

import torch

_rms_norm = torch.ops.keel.rms_norm.default
_fused_add_rms_norm = torch.ops.keel.fused_add_rms_norm.default


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2, -1) + eps) * weight, in float32 math; returns a new contiguous tensor."""
    return _rms_norm(x, weight, eps)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """In place: residual += x, then x = rms_norm(residual, weight, eps) (one pass over both)."""
    _fused_add_rms_norm(x, residual, weight, eps)


def _check_weight(op: str, x: torch.Tensor, weight: torch.Tensor) -> None:
    torch._check(x.dim() >= 1, lambda: f"{op}: x must have at least 1 dimension(s), got {x.dim()}-D")
    torch._check(weight.dim() == 1 and weight.shape[0] == x.shape[-1],
                 lambda: f"{op}: weight must be 1-D with {x.shape[-1]} elements (the last dim of x), "
                 f"got shape {list(weight.shape)}")


# Output shape for torch.compile / FakeTensor tracing.
@torch.library.register_fake("keel::rms_norm")
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    _check_weight("keel::rms_norm", x, weight)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# Mutates its inputs and returns nothing; the fake only validates shapes.
@torch.library.register_fake("keel::fused_add_rms_norm")
def _(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    _check_weight("keel::fused_add_rms_norm", x, weight)
    torch._check(residual.shape == x.shape, lambda: "keel::fused_add_rms_norm: residual must have "
                 f"the shape of x {list(x.shape)}, got {list(residual.shape)}")
