"""Argument checks of the fake (meta) implementations, worded like the C++ kernels' checks.

A fake must refuse what the real kernel refuses, with the same kind of message (the op, the
argument, what was expected), so that tracing with FakeTensors or running on the meta device
fails where eager would, and never with a bare IndexError.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from keel import _compat

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# as csrc/stable/tensor.h scalar_type_name spells them; any other dtype is "dtype#<c10::ScalarType code>"
_NAMES = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.float64: "float64",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.int16: "int16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.bool: "bool",
}
_SCALAR_TYPE_CODES = {
    "complex32": 8,
    "complex64": 9,
    "complex128": 10,
    "float8_e5m2": 23,
    "float8_e4m3fn": 24,
    "float8_e5m2fnuz": 25,
    "float8_e4m3fnuz": 26,
    "uint16": 27,
    "uint32": 28,
    "uint64": 29,
}


def dtype_name(dt: torch.dtype) -> str:
    """float32, bfloat16, ..., dtype#9 (complex64): as the kernels' messages spell dtypes (scalar_type_name)."""
    if dt in _NAMES:
        return _NAMES[dt]
    name = str(dt).removeprefix("torch.")
    return f"dtype#{_SCALAR_TYPE_CODES.get(name, name)}"


def cpp_number(v: float) -> str:
    """A double as the kernels' messages print it (`std::ostream << v`: %g; glibc spells a negative NaN -nan)."""
    if math.isnan(v):
        return "-nan" if math.copysign(1.0, v) < 0 else "nan"
    return f"{v:g}"


def shape(t: torch.Tensor) -> list[int]:
    return list(t.shape)


def check(cond: object, message: str) -> None:
    """RuntimeError(message) unless cond (symbolic-size aware: keel._compat.check)."""
    _compat.check(cond, lambda: message)


def tensor(op: str, arg: str, t: object) -> None:
    """None reaching a Tensor argument (torch passes it on as an undefined tensor)."""
    check(isinstance(t, torch.Tensor), f"{op}: {arg} must be a tensor, got an undefined tensor (None)")


def float_dtype(op: str, arg: str, t: torch.Tensor, allowed: Sequence[torch.dtype] = FLOAT_DTYPES) -> None:
    tensor(op, arg, t)
    names = [dtype_name(d) for d in allowed]
    expected = ", ".join(names[:-1]) + " or " + names[-1]
    check(t.dtype in allowed, f"{op}: {arg} must be {expected}, got {dtype_name(t.dtype)}")


def same_dtype(op: str, arg: str, t: torch.Tensor, ref_arg: str, ref: torch.Tensor) -> None:
    check(
        t.dtype == ref.dtype,
        f"{op}: {arg} must have the dtype of {ref_arg} ({dtype_name(ref.dtype)}), got {dtype_name(t.dtype)}",
    )


def same_device(op: str, arg: str, t: torch.Tensor, ref_arg: str, ref: torch.Tensor) -> None:
    tensor(op, arg, t)
    tensor(op, ref_arg, ref)
    check(t.device == ref.device, f"{op}: {arg} must be on the device of {ref_arg} ({ref.device}), got {t.device}")


def dim(op: str, arg: str, t: torch.Tensor, n: int) -> None:
    check(t.dim() == n, f"{op}: {arg} must be {n}-D, got {t.dim()}-D tensor of shape {shape(t)}")


def min_dim(op: str, arg: str, t: torch.Tensor, n: int) -> None:
    check(t.dim() >= n, f"{op}: {arg} must have at least {n} dimension(s), got {t.dim()}-D tensor of shape {shape(t)}")


def same_shape(op: str, arg: str, t: torch.Tensor, ref_arg: str, ref: torch.Tensor) -> None:
    check(t.shape == ref.shape, f"{op}: {arg} must have the shape of {ref_arg} {shape(ref)}, got {shape(t)}")


def not_same(op: str, arg_a: str, a: torch.Tensor, arg_b: str, b: torch.Tensor) -> None:
    """The one aliasing case a fake can see: the very same tensor passed twice."""
    check(
        a is not b,
        f"{op}: {arg_a} and {arg_b} share memory, but {arg_a} is written in place; pass tensors that do not overlap",
    )


def eps(op: str, value: float) -> None:
    check(value >= 0.0, f"{op}: eps must be a non-negative number, got {cpp_number(value)}")


def norm_weight(op: str, x: torch.Tensor, weight: torch.Tensor) -> None:
    """x and weight of rms_norm / fused_add_rms_norm (csrc/ops/rms_norm_launch.h)."""
    tensor(op, "x", x)
    float_dtype(op, "x", x)
    min_dim(op, "x", x, 1)
    same_device(op, "weight", weight, "x", x)
    same_dtype(op, "weight", weight, "x", x)
    check(
        weight.dim() == 1 and weight.shape[0] == x.shape[-1],
        f"{op}: weight must be 1-D with {x.shape[-1]} elements (the last dim of x), got shape {shape(weight)}",
    )
