"""Linear layer op: keel's few-row GEMV on CPU (decode), aten::linear for more rows and on CUDA."""

from __future__ import annotations

import torch

_linear = torch.ops.keel.linear.default


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T + bias for x [..., K], weight [N, K] (unit K stride), bias [N]; new contiguous [..., N]."""
    return _linear(x, weight, bias)


# Output shape for torch.compile / FakeTensor tracing.
@torch.library.register_fake("keel::linear")
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    torch._check(
        x.dim() >= 1 and weight.dim() == 2 and weight.shape[1] == x.shape[-1],
        lambda: f"keel::linear: weight must be [N, {x.shape[-1]}] to match x's last dim, got {list(weight.shape)}",
    )
    return x.new_empty((*x.shape[:-1], weight.shape[0]))
