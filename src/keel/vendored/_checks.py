"""The adapters' argument checks (adapters/common/adapter.h, csrc/stable/), for the vendored ops' fakes.

A vendored op's fake (meta) implementation must refuse what its adapter and fork refuse, with the
same message, so a meta tensor or torch.compile trace gets the error eager gets. These helpers mirror
the C++ pieces word for word: dtype names as csrc/stable/tensor.h's scalar_type_name prints them,
shapes as "[2, 3]", numbers as C++ streams print them, and the adapters' narrowing checks.
"""

from __future__ import annotations

import math
import struct

import torch

from keel.ops import _checks as chk

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
FLOAT32_MAX = 3.4028234663852886e38

stable_dtype_name = chk.dtype_name  # csrc/stable/tensor.h scalar_type_name's spelling
cpp_number = chk.cpp_number  # std::ostream << double


def shape(t: torch.Tensor) -> str:
    """A shape as the C++ messages print it: [2, 3]."""
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def as_float32(v: float) -> float:
    """v rounded to a C++ float (the forks' type), as the adapters' static_cast<float> does."""
    if not math.isfinite(v):
        return v
    return float(struct.unpack("f", struct.pack("f", v))[0])


def fail(message: str) -> None:
    """Raise RuntimeError(message), as KEEL_CHECK does."""
    chk.check(False, message)


def library_device(op: str, arg: str, t: object, ref: torch.Tensor | None) -> torch.Tensor:
    """check_library_device: a defined tensor, on the device of the op's first tensor `ref`.

    The CPU library refuses anything but CPU tensors ("must be a CPU tensor"); a fake sees meta or
    FakeTensors standing in for one device, so it requires that every argument is on the same one."""
    if not isinstance(t, torch.Tensor):
        fail(f"{op}: {arg} must be a tensor, got an undefined tensor (None)")
    assert isinstance(t, torch.Tensor)
    if ref is not None and t.device != ref.device:
        fail(f"{op}: {arg} must be on the device of the op's first tensor ({ref.device}), got {t.device}")
    return t


def to_int(op: str, arg: str, v: int) -> int:
    """adapter::to_int: the dispatcher's int64 must fit the fork's 32-bit int."""
    if not INT32_MIN <= v <= INT32_MAX:
        fail(f"{op}: {arg} must fit in a 32-bit int (the vendored kernel's type), got {v}")
    return v


def to_float(op: str, arg: str, v: float) -> float:
    """adapter::to_float: a finite double must stay finite as a 32-bit float; inf and nan pass."""
    if math.isfinite(v) and abs(v) > FLOAT32_MAX:
        fail(f"{op}: {arg} must fit in a 32-bit float (the vendored kernel's type), got {cpp_number(v)}")
    return as_float32(v)
