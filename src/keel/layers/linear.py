"""How a model's `nn.Linear` layers run: the engine's model runner swaps them (a policy applied to the loaded
model, as gpt-fast applies compilation in its runner); the model code stays plain `nn.Linear`.

Default (`KeelLinear`): every projection through `keel.ops.linear`, whose CPU kernel takes any row count, so
CPU results depend on keel's code only and are the same on every torch release. Opt-in (`PackedLinear`,
`cpu_prepack=True`): prefill through oneDNN's prepacked weights, faster for long prompts, but its rounding
is the oneDNN version's of the torch installed."""

from __future__ import annotations

import torch
from torch import nn

from keel import _compat, ops
from keel.ops.layer import Projection, Weights


class KeelLinear(nn.Module):
    """`nn.Linear` whose forward is `keel.ops.linear` for every input (decode and prefill)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x, self.weight, self.bias)

    def op_weights(self) -> Weights:
        """The weights the fused layer ops take for this projection (keel.ops.layer): keel::linear's."""
        return (self.weight, None, self.bias, None)


def projection(module: nn.Module) -> Projection:
    """A projection module as the fused layer ops take it (keel.ops.layer): its `op_weights()` (keel's linear, or
    FP8 on the CPU), a plain nn.Linear's weight and bias, else the module itself, called as a function (oneDNN's
    prepacked linear, FP8 on CUDA, any other module): the ops then run as keel's separate ops around it."""
    op_weights = getattr(module, "op_weights", None)
    weights = op_weights() if callable(op_weights) else None
    if weights is not None:
        return weights
    if type(module) is nn.Linear:
        return (module.weight, None, module.bias, None)
    return module


def keel_linears(model: nn.Module) -> int:
    """Replace every `nn.Linear` of `model` by a `KeelLinear`, in place; returns how many."""
    count = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, KeelLinear(child))
                count += 1
    return count


class PackedLinear(nn.Module):
    """`nn.Linear` that runs few-row calls (decode) through `keel.ops.linear` and the rest (prefill) through a
    copy of the weight that oneDNN has reordered once into its blocked layout.

    Few rows go to keel's GEMV, which streams the plain weight faster than oneDNN's prepacked kernel does
    at decode sizes; prompts go to oneDNN, which reorders the weight for its blocked GEMM (the crossover
    measured on SmolLM2-135M: docs/measurements/2026-12-01-generate-vs-transformers.md). The cost is both
    copies of the weight in memory. The oneDNN ops are private torch API (keel._compat): where this torch
    lacks them, prefill runs `F.linear` on the plain weight."""

    def __init__(self, linear: nn.Linear, batch_hint: int = 8, gemv_rows: int = 8) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.packed = _compat.mkldnn_prepack_linear(linear.weight, batch_hint)
        self.gemv_rows = gemv_rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() <= self.gemv_rows * self.in_features:  # rows of x <= gemv_rows
            return ops.linear(x, self.weight, self.bias)
        return _compat.mkldnn_linear(x, self.packed, self.weight, self.bias)


def can_pack(weight: torch.Tensor) -> bool:
    """Packing helps only half-precision weights on a CPU with oneDNN."""
    return (
        weight.device.type == "cpu"
        and weight.dtype in (torch.bfloat16, torch.float16)
        and torch.backends.mkldnn.is_available()
    )


def pack_linears(model: nn.Module, gemv_rows: int = 8) -> int:
    """Replace every packable `nn.Linear` of `model` by a `PackedLinear`, in place; returns how many."""
    count = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and can_pack(child.weight):
                setattr(module, name, PackedLinear(child, gemv_rows=gemv_rows))
                count += 1
    return count
