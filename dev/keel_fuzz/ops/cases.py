"""One fuzz case, rebuilt from its seed: a valid call of the op (its example) with one to three arguments
mutated, or random arguments built from the op's schema; then its outcome.

Arguments cover real (CPU) and meta tensors, every common dtype, ranks 0-4, 0-size dims, huge dims on
meta, non-contiguous and expanded layouts, huge and negative ints, nan/inf floats, aliased in-place
arguments, another device than the other arguments, and values of the wrong Python type.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from keel._compat import OpSchema

DTYPES = ("float32", "bfloat16", "float16", "float64", "int64", "int32", "int8", "uint8", "bool", "complex64")
SIZES = (0, 1, 2, 3, 4, 5, 8, 16)
HUGE_INTS = (0, 1, -1, 2, 3, 7, 64, -64, 2**31 - 1, 2**31, 2**62, 2**63 - 1, -(2**63))
ODD_FLOATS = (0.0, -0.0, 1e-6, 1.0, -1.0, float("nan"), float("inf"), float("-inf"), 1e308, -1e-300)
ODD_ELEMENTS = (0.0, -0.0, float("nan"), float("inf"), float("-inf"), 3e38, -1e-30, 65504.0)  # fit float32
OUTCOMES = ("ok", "named", "unnamed", "crash", "hang", "harness")
DEFECTS = ("unnamed", "crash", "hang", "harness")

# (rng, device, dtype) -> the arguments of one valid call
Example = Callable[[random.Random, str, torch.dtype], list[Any]]


def t(shape: tuple[int, ...], device: str, dtype: torch.dtype) -> torch.Tensor:
    """A random tensor of `shape` for an example (drawn on the CPU, then moved: meta tensors have no values)."""
    return torch.randn(shape).to(dtype).to(device)


@dataclass(frozen=True, slots=True)
class Case:
    """One case: its seed and op; everything else is derived from the seed."""

    seed: int
    namespace: str
    op: str

    @property
    def qualname(self) -> str:
        return f"{self.namespace}::{self.op}"


def _tensor(rng: random.Random, device: str, dtype: str | None = None, shape: tuple[int, ...] | None = None) -> Any:
    """A random tensor: dtype, rank 0-4, sizes (0 included), layout, and odd values."""
    dt = getattr(torch, dtype or rng.choice(DTYPES))
    if shape is None:
        shape = tuple(rng.choice(SIZES) for _ in range(rng.randint(0, 4)))
    if device == "meta" and shape and rng.random() < 0.1:
        shape = (*shape[:-1], rng.choice((2**31, 2**40)))  # huge dims cost nothing on meta
    return _fill(rng, torch.empty(shape, dtype=dt, device=device), layout=rng.random())


def _fill(rng: random.Random, t: torch.Tensor, layout: float) -> torch.Tensor:
    """Odd values (real tensors) and an odd layout: transposed, strided, expanded or contiguous."""
    if t.device.type != "meta" and t.numel():
        t = t.contiguous()
        if t.dtype.is_floating_point or t.dtype.is_complex:
            t.copy_((torch.randn(t.shape, dtype=torch.float32) * rng.choice((1.0, 1e-3, 1e4))).to(t.dtype))
            flat = t.view(-1)
            for _ in range(rng.randint(0, 3)):
                flat[rng.randrange(flat.numel())] = rng.choice(ODD_ELEMENTS)
        elif t.dtype == torch.bool:
            t.copy_(torch.rand(t.shape) > 0.5)
        else:
            info = torch.iinfo(t.dtype)
            vals = [v for v in HUGE_INTS if info.min <= v <= info.max]
            t.copy_(torch.tensor([rng.choice(vals) for _ in range(t.numel())], dtype=t.dtype).view(t.shape))
    if t.dim() >= 2 and layout < 0.15:
        return t.transpose(0, 1).contiguous().transpose(0, 1)
    if t.dim() >= 1 and layout < 0.3:
        wide = torch.empty((*t.shape[:-1], t.shape[-1] * 2), dtype=t.dtype, device=t.device)
        view = wide[..., ::2]
        view.copy_(t)
        return view
    if t.dim() >= 1 and layout < 0.35 and t.shape[0] == 1:
        return t.expand(3, *t.shape[1:])  # stride 0: written in place, it overlaps itself
    return t


def _mutate_tensor(rng: random.Random, typ: str, v: Any, args: list[Any], device: str) -> Any:
    roll = rng.random()
    if not isinstance(v, torch.Tensor) or roll < 0.25:
        return _tensor(rng, device)
    if roll < 0.45:
        with warnings.catch_warnings():  # complex -> real drops the imaginary part: that is the point
            warnings.simplefilter("ignore", UserWarning)
            return v.to(getattr(torch, rng.choice(DTYPES)))
    if roll < 0.6 and v.dim():
        shape = list(v.shape)
        shape[rng.randrange(len(shape))] = rng.choice(SIZES)
        return _tensor(rng, device, str(v.dtype).removeprefix("torch."), tuple(shape))
    if roll < 0.7:
        return v.reshape(-1) if rng.random() < 0.5 else v[None]
    if roll < 0.8:  # alias: another tensor argument again, or a view of it
        other = args[rng.randrange(len(args))]
        if isinstance(other, torch.Tensor):
            same_shape = other.shape == v.shape and rng.random() < 0.5
            return other.view(v.shape) if same_shape and other.is_contiguous() else other
        return v
    if roll < 0.9:
        return _fill(rng, v.clone(), layout=rng.random())
    if "Optional" in typ:
        return None
    if v.device.type == "cpu":
        return v.to("meta")
    if v.numel() <= 4096:  # another device than the other arguments
        return torch.zeros(v.shape, dtype=v.dtype)
    return v


def _mutate(rng: random.Random, arg_types: Sequence[tuple[str, str]], args: list[Any], device: str) -> list[Any]:
    args = list(args)
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(args))
        typ = arg_types[i][1]
        if "Tensor" in typ:
            args[i] = _mutate_tensor(rng, typ, args[i], args, device)
        elif "Optional" in typ and rng.random() < 0.2:
            args[i] = None
        elif "int" in typ:
            args[i] = rng.choice(HUGE_INTS)
        elif "float" in typ:
            args[i] = rng.choice(ODD_FLOATS)
        elif "bool" in typ:
            args[i] = not args[i]
        if rng.random() < 0.05:  # wrong Python type altogether
            args[i] = rng.choice((None, "x", 1.5, 3, [1, 2]))
    return args


def _random_args(rng: random.Random, arg_types: Sequence[tuple[str, str]], device: str) -> list[Any]:
    out: list[Any] = []
    for _, typ in arg_types:
        optional = "Optional" in typ
        if "Tensor" in typ:
            out.append(None if optional and rng.random() < 0.3 else _tensor(rng, device))
        elif optional and rng.random() < 0.3:
            out.append(None)
        elif "int" in typ:
            out.append(rng.choice(HUGE_INTS))
        elif "float" in typ:
            out.append(rng.choice(ODD_FLOATS))
        elif "bool" in typ:
            out.append(rng.random() < 0.5)
        else:
            out.append(None)
    return out


def build_call(
    case: Case, schema: OpSchema, examples: dict[str, Example], device: str | None = None
) -> tuple[Callable[..., Any], list[Any]]:
    """The op overload and the arguments of `case` (deterministic in the seed; `device` forces one)."""
    rng = random.Random(case.seed)
    torch.manual_seed(case.seed)
    overload = getattr(getattr(torch.ops, case.namespace), case.op).default
    picked = "meta" if rng.random() < 0.35 else "cpu"
    device = device or picked
    example = examples.get(case.qualname)
    if example is not None and rng.random() < 0.85:
        dtype = getattr(torch, rng.choice(("float32", "bfloat16", "float16")))
        args = example(rng, device, dtype)
        if rng.random() < 0.9:
            args = _mutate(rng, schema.arg_types, args, device)
    else:
        args = _random_args(rng, schema.arg_types, device)
    return overload, args


def names_op(message: str, case: Case) -> bool:
    """keel's messages say `ns::op`; torch's dispatcher and FakeTensor say `ns::op(` or `ns.op.default`."""
    return case.qualname in message or f"{case.namespace}.{case.op}" in message


def run_case(case: Case, schema: OpSchema, examples: dict[str, Example]) -> dict[str, str]:
    """Build and call `case`: {"outcome": ok | named | unnamed | harness, "error": the message}."""
    try:
        overload, args = build_call(case, schema, examples)
    except Exception as exc:  # noqa: BLE001 - the harness's own bug, not the op's: counted apart
        return {"outcome": "harness", "error": f"{type(exc).__name__}: {exc}"[:400]}
    try:
        overload(*args)
    except Exception as exc:  # noqa: BLE001 - every error is fine if it names the op
        msg = f"{type(exc).__name__}: {exc}"
        return {"outcome": "named" if names_op(msg, case) else "unnamed", "error": msg[:400]}
    return {"outcome": "ok"}


def on_meta(args: list[Any]) -> list[Any]:
    """`args` with every tensor replaced by a meta tensor of the same shape, strides and dtype."""
    return [
        torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta") if isinstance(a, torch.Tensor) else a
        for a in args
    ]
