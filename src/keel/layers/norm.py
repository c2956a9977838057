"""`RMSNorm` over keel's `rms_norm` / `fused_add_rms_norm` ops."""

from __future__ import annotations

import torch
from torch import nn

from keel import ops


class RMSNorm(nn.Module):
    """RMSNorm; with a residual it does the fused `residual += x; x = norm(residual)` in place."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return ops.rms_norm(x, self.weight, self.eps)
        ops.fused_add_rms_norm(x, residual, self.weight, self.eps)
        return x, residual
