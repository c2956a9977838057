"""FP8 weights (`quantization="fp8"`): every `nn.Linear` becomes an `Fp8Linear` whose weight is cast once, at
load time, to float8_e4m3fn with fp32 scales per row and 128-wide K group (DeepGEMM's (1, 1, 128) recipe;
DeepSeek-V3's 128x128 blocks are the other choice). On CUDA its input is cast per token (1x128 groups) at
every call, as DeepSeek-V3 runs its linears, and the product runs through the vendored DeepGEMM-style
`fp8_gemm_nt`. On the CPU the input is not quantized: `keel.ops.fp8_linear` (keel's own e4m3 GEMV, decoding
the weight in registers) multiplies the bf16/fp32 activations by the dequantized weight in one call
(weight-only FP8: fewer roundings than the per-token cast, and no cast op per call). A runner policy like
linear.py's prepacking: the model code stays plain `nn.Linear`. The embedding lookup keeps its bf16/fp32
table (a tied lm_head gets its own FP8 copy)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from keel import ops
from keel.layers import generation
from keel.layers.linear import KeelLinear
from keel.ops.layer import Weights

QUANTIZATIONS = ("none", "fp8")
# DeepGEMM's scale recipes (m, n, k): (1, 128, 128) = 128x128 weight blocks (DeepSeek-V3's);
# (1, 1, 128) = one scale per weight row and 128-wide K group (4 bytes of scale per 128 weight bytes: 3%
# more memory), the default: it costs less perplexity at the same decode speed (figures:
# docs/measurements/2026-12-01-fp8.md).
BLOCK_RECIPE = (1, 128, 128)
ROW_RECIPE = (1, 1, 128)
DEFAULT_RECIPE = ROW_RECIPE


def check_quantization(quantization: str | None) -> str:
    """The quantization name, defaulting to "none"; a clear error for anything else."""
    q = quantization or "none"
    if q not in QUANTIZATIONS:
        raise ValueError(f"quantization {quantization!r} is not supported; expected one of {', '.join(QUANTIZATIONS)}")
    return q


class Fp8Linear(nn.Module):
    """`nn.Linear` with a block-scaled FP8 weight: y = fp8_gemm_nt(per_token_cast(x), (w_fp8, w_scale)) + bias.

    Outputs have the input's dtype (bf16 or fp32: what fp8_gemm_nt writes; other dtypes go through fp32). On the
    CPU: y = keel.ops.fp8_linear(x, (w_fp8, w_scale)) + bias, x not quantized."""

    qweight: torch.Tensor  # buffers, typed for readers (register_buffer hides the type)
    weight_scale: torch.Tensor
    special_rows: torch.Tensor | None

    def __init__(self, linear: nn.Linear | KeelLinear, recipe: tuple[int, int, int] = DEFAULT_RECIPE) -> None:
        super().__init__()
        from keel.vendored import deep_gemm  # loads the vendored library only when FP8 is asked for

        self._dg = deep_gemm
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        w = weight if weight.dtype in (torch.bfloat16, torch.float32) else weight.float()
        if recipe not in (BLOCK_RECIPE, ROW_RECIPE):
            raise ValueError(f"Fp8Linear: recipe must be {BLOCK_RECIPE} or {ROW_RECIPE}, got {recipe}")
        self.recipe = recipe
        if recipe == ROW_RECIPE:
            qweight, scale = deep_gemm.per_token_cast_to_fp8(w.contiguous())  # 1x128 groups of each row
        else:
            qweight, scale = deep_gemm.per_block_cast_to_fp8(w.contiguous())
        self.register_buffer("qweight", qweight)  # [N, K] float8_e4m3fn
        self.register_buffer("weight_scale", scale)  # [N or ceil(N/128), ceil(K/128)] fp32
        # derived from qweight, so not saved with the weights
        self.register_buffer("special_rows", self._find_special_rows(qweight), persistent=False)
        self.bias = linear.bias

    @staticmethod
    def _find_special_rows(qweight: torch.Tensor) -> torch.Tensor | None:
        """CPU: which rows hold e4m3 bytes the kernel's fast decode cannot take, found once (at load) rather than
        by a scan in every one-row call; None elsewhere (the kernel then scans)."""
        return ops.fp8_special_rows(qweight) if qweight.device.type == "cpu" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu":  # weight-only FP8 through keel's kernel, any leading dims, x's dtype
            return ops.fp8_linear(x, self.qweight, self.weight_scale, self.bias, self.special_rows)
        shape = x.shape
        rows = x.reshape(-1, self.in_features)
        if rows.dtype not in (torch.bfloat16, torch.float32):
            rows = rows.float()
        a = self._dg.per_token_cast_to_fp8(rows)
        out = torch.empty(rows.shape[0], self.out_features, dtype=rows.dtype, device=rows.device)
        self._dg.fp8_gemm_nt(a, (self.qweight, self.weight_scale), out, c=None, recipe=self.recipe)
        if self.bias is not None:
            out += self.bias
        return out.to(x.dtype).view(*shape[:-1], self.out_features)

    def _load_from_state_dict(self, *args: object, **kwargs: object) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self.special_rows = self._find_special_rows(self.qweight)  # new bytes: their special rows again

    def op_weights(self) -> Weights | None:
        """The weights the fused layer ops take for this projection (keel.ops.layer): keel::fp8_linear's on the CPU;
        None elsewhere (CUDA runs this module's forward, the vendored FP8 GEMM)."""
        if self.qweight.device.type != "cpu":
            return None
        return (self.qweight, self.weight_scale, self.bias, self.special_rows)

    def _apply(self, *args: Any, **kwargs: Any) -> Any:
        generation.bump()  # new buffers, not registered: layers rebind them
        return super()._apply(*args, **kwargs)

    def extra_repr(self) -> str:
        block = f"{self.recipe[1]}x{self.recipe[2]}"
        return f"in_features={self.in_features}, out_features={self.out_features}, weight=fp8_e4m3 {block} blocks"


def quantize_linears(model: nn.Module, recipe: tuple[int, int, int] = DEFAULT_RECIPE) -> int:
    """Replace every `nn.Linear` (or the runner's `KeelLinear`) of `model`, lm_head included, by an
    `Fp8Linear`, in place; returns how many."""
    count = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, (nn.Linear, KeelLinear)):
                setattr(module, name, Fp8Linear(child, recipe))
                count += 1
    return count
