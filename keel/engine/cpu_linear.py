"""oneDNN-prepacked linear layers for bf16/fp16 on CPU: a runner policy, the model code stays plain `nn.Linear`."""

from __future__ import annotations

import torch
from torch import nn


class PackedLinear(nn.Module):
    """`nn.Linear` whose weight oneDNN has reordered once into its blocked layout.

    On a 2-core AVX512-BF16 CPU this makes SmolLM2-135M decode ~25% faster than `F.linear` (which re-reads
    the plain layout each call) and prefill no slower; results are identical."""

    def __init__(self, linear: nn.Linear, batch_hint: int = 8) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), batch_hint)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [None], "")


def can_pack(weight: torch.Tensor) -> bool:
    """Packing helps only half-precision weights on a CPU with oneDNN."""
    return (
        weight.device.type == "cpu"
        and weight.dtype in (torch.bfloat16, torch.float16)
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def pack_linears(model: nn.Module) -> int:
    """Replace every `nn.Linear` of `model` by a `PackedLinear`, in place; returns how many were packed."""
    count = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and can_pack(child.weight):
                setattr(module, name, PackedLinear(child))
                count += 1
    return count
