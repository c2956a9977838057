"""Elementwise ops: fused_muladd."""

from __future__ import annotations

import torch

from keel import _compat
from keel.ops import _checks as chk

_fused_muladd = torch.ops.keel.fused_muladd.default
_OP = "keel::fused_muladd"


def fused_muladd(a: torch.Tensor, b: torch.Tensor, c: float) -> torch.Tensor:
    """a * b + c in one pass (same shape and dtype, any strides); returns a contiguous tensor.

    float32, bfloat16 and float16 (math in float32, one rounding), and float64 (math in float64).
    """
    if torch.compiler.is_compiling() or torch.is_inference_mode_enabled():  # (inference: no autograd keys)
        return _fused_muladd(a, b, c)
    if torch.is_grad_enabled() and (getattr(a, "requires_grad", False) or getattr(b, "requires_grad", False)):
        return _fused_muladd(a, b, c)
    # No gradient can flow: skip the Python autograd kernel (a private torch API; see keel._compat).
    with _compat.below_autograd():
        return _fused_muladd(a, b, c)


# Shapes and dtypes for torch.compile / FakeTensor tracing, with the kernel's own checks.
@torch.library.register_fake("keel::fused_muladd")
def _(a: torch.Tensor, b: torch.Tensor, c: float) -> torch.Tensor:
    chk.tensor(_OP, "a", a)  # the kernel's order: devices, then dtypes
    chk.same_device(_OP, "b", b, "a", a)
    chk.float_dtype(_OP, "a", a, (*chk.FLOAT_DTYPES, torch.float64))
    chk.same_dtype(_OP, "b", b, "a", a)
    chk.same_shape(_OP, "b", b, "a", a)
    return torch.empty_like(a, memory_format=torch.contiguous_format)


# d(a*b+c)/da = b, d/db = a, d/dc = sum(grad) (c is a Python float: no gradient). The backward is
# made of differentiable torch ops, so double backward works too (tests/ops: gradgradcheck).
def _setup_context(ctx, inputs, output) -> None:
    a, b, _c = inputs
    ctx.save_for_backward(a if ctx.needs_input_grad[1] else None, b if ctx.needs_input_grad[0] else None)


def _backward(ctx, grad: torch.Tensor):
    a, b = ctx.saved_tensors
    grad_a = grad * b if ctx.needs_input_grad[0] else None
    grad_b = grad * a if ctx.needs_input_grad[1] else None
    return grad_a, grad_b, None


torch.library.register_autograd("keel::fused_muladd", _backward, setup_context=_setup_context)
