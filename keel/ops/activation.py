"""Activation ops: silu_and_mul (SwiGLU)."""

from __future__ import annotations

import torch

_silu_and_mul = torch.ops.keel.silu_and_mul.default


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :d]) * x[..., d:] for x with last dim 2d; returns a new contiguous [..., d] tensor."""
    return _silu_and_mul(x)


# Output shape for torch.compile / FakeTensor tracing.
@torch.library.register_fake("keel::silu_and_mul")
def _(x: torch.Tensor) -> torch.Tensor:
    torch._check(x.dim() >= 1 and x.shape[-1] % 2 == 0, lambda: "keel::silu_and_mul: x last dim must be "
                 f"even (gate and up halves), got shape {list(x.shape)}")
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))
