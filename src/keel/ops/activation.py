"""Activation ops: silu_and_mul (SwiGLU)."""

from __future__ import annotations

import torch

from keel.ops import _checks as chk

_silu_and_mul = torch.ops.keel.silu_and_mul.default
_OP = "keel::silu_and_mul"


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :d]) * x[..., d:] for x with last dim 2d; returns a new contiguous [..., d] tensor."""
    return _silu_and_mul(x)


# Output shape for torch.compile / FakeTensor tracing, with the kernel's checks.
@torch.library.register_fake("keel::silu_and_mul")
def _(x: torch.Tensor) -> torch.Tensor:
    chk.float_dtype(_OP, "x", x)
    chk.min_dim(_OP, "x", x, 1)
    chk.check(x.shape[-1] % 2 == 0, f"{_OP}: x last dim must be even (gate and up halves), got shape {chk.shape(x)}")
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))
