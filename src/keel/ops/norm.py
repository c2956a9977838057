"""Normalization ops: rms_norm and fused_add_rms_norm."""

from __future__ import annotations

import torch

from keel.ops import _checks as chk

_rms_norm = torch.ops.keel.rms_norm.default
_fused_add_rms_norm = torch.ops.keel.fused_add_rms_norm.default


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2, -1) + eps) * weight, in float32 math; returns a new contiguous tensor."""
    return _rms_norm(x, weight, eps)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """In place: residual += x, then x = rms_norm(residual, weight, eps) (one pass over both).

    x, residual and weight must not share memory (refused with an error).
    """
    _fused_add_rms_norm(x, residual, weight, eps)


# Output shape for torch.compile / FakeTensor tracing, with the kernel's checks.
@torch.library.register_fake("keel::rms_norm")
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    chk.norm_weight("keel::rms_norm", x, weight)
    chk.eps("keel::rms_norm", eps)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# Mutates its inputs and returns nothing; the fake only validates.
@torch.library.register_fake("keel::fused_add_rms_norm")
def _(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    op = "keel::fused_add_rms_norm"
    chk.norm_weight(op, x, weight)
    chk.eps(op, eps)
    chk.same_device(op, "residual", residual, "x", x)
    chk.same_dtype(op, "residual", residual, "x", x)
    chk.same_shape(op, "residual", residual, "x", x)
    chk.not_same(op, "x", x, "residual", residual)
    chk.not_same(op, "x", x, "weight", weight)
