"""Linear layer op: keel's own kernel on CPU for any row count (results independent of torch's oneDNN),
aten::linear on CUDA."""

from __future__ import annotations

import torch

from keel.ops import _checks as chk

_linear = torch.ops.keel.linear.default
_OP = "keel::linear"


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T + bias for x [..., K], weight [N, K] (unit K stride), bias [N]; new contiguous [..., N]."""
    return _linear(x, weight, bias)


# Output shape for torch.compile / FakeTensor tracing, with the kernel's checks.
@torch.library.register_fake("keel::linear")
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    chk.float_dtype(_OP, "x", x)
    chk.min_dim(_OP, "x", x, 1)
    chk.same_device(_OP, "weight", weight, "x", x)
    chk.same_dtype(_OP, "weight", weight, "x", x)
    k = x.shape[-1]
    chk.check(
        weight.dim() == 2 and weight.shape[1] == k,
        f"{_OP}: weight must be [N, {k}] to match x's last dim, got {chk.shape(weight)}",
    )
    chk.check(
        weight.stride(1) == 1 or k <= 1,
        f"{_OP}: weight must have unit stride along its last dim (K), got stride {weight.stride(1)}",
    )
    if bias is not None:
        chk.same_device(_OP, "bias", bias, "x", x)
        chk.same_dtype(_OP, "bias", bias, "x", x)
        chk.check(
            bias.dim() == 1 and bias.shape[0] == weight.shape[0],
            f"{_OP}: bias must be [{weight.shape[0]}] to match weight's rows, got {chk.shape(bias)}",
        )
    return x.new_empty((*x.shape[:-1], weight.shape[0]))
