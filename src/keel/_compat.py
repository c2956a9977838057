"""Every use of a private (underscored, unstable) torch API in keel, each with a fallback.

A torch release may remove or change any of these without notice. keel then loses speed, never
correctness: each function here looks the private API up at call time, and when it is missing or
fails, does the same job with public API. tests/test_compat.py removes each private API and
checks that the fallback gives the same result (tests/vendored covers registered_schemas). A flat
module of small functions, on purpose.

`torch._check` is documented (torch docs, "torch._check") as the way to state a condition on
possibly symbolic sizes in fake implementations; it is routed through `check` anyway, so that
keel names every underscored torch symbol it touches in this one file.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


def private(owner: Any, name: str) -> Any:
    """`owner.name` (a private torch API), or None where this torch lacks it. The one lookup every
    function here goes through, so a test can take any private API away from keel alone (torch's
    own code may need it: deleting it from torch would break torch, not test keel)."""
    return getattr(owner, name, None)


def check(cond: Any, message: Callable[[], str]) -> None:
    """Raise RuntimeError(message()) unless `cond`; `torch._check` (symbolic-size aware) when present."""
    checker = private(torch, "_check")
    if checker is not None:
        checker(cond, message)
    elif not cond:
        raise RuntimeError(message())


def below_autograd() -> contextlib.AbstractContextManager[Any]:
    """A context that dispatches below the Autograd key (skips the Python autograd kernel of a
    custom op when no gradient can flow: most of a small call's cost, docs/measurements/2026-12-01-ops-overhead.md).
    Fallback: a no-op context, so the call goes through autograd and gives the same result, slower."""
    guard = private(torch._C, "_AutoDispatchBelowAutograd")
    if guard is None:
        return contextlib.nullcontext()
    return guard()


def op_entry(overload: Any) -> Callable[..., Any]:
    """The callable behind a `torch.ops.ns.op.overload` object (its private `_op`: the C++ entry that
    `OpOverload.__call__` forwards to, one Python frame less per call, for a model's inner loop). Fallback:
    the overload object itself (the same call through `OpOverload.__call__`)."""
    entry = private(overload, "_op")
    return entry if callable(entry) else overload


def mkldnn_prepack_linear(weight: torch.Tensor, batch_hint: int) -> torch.Tensor | None:
    """oneDNN's blocked copy of a linear `weight` (torch.ops.mkldnn._reorder_linear_weight), or
    None when this torch has no such op or it refuses the weight (callers then use F.linear)."""
    reorder = private(torch.ops.mkldnn, "_reorder_linear_weight")
    if reorder is None or private(torch.ops.mkldnn, "_linear_pointwise") is None:
        return None
    try:
        return reorder(weight.detach(), batch_hint)
    except (RuntimeError, TypeError):
        return None


def mkldnn_linear(
    x: torch.Tensor, packed: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x @ weight.T + bias with oneDNN's prepacked `packed` weight
    (torch.ops.mkldnn._linear_pointwise); F.linear on the plain weight when packed is None."""
    if packed is not None:
        fn = private(torch.ops.mkldnn, "_linear_pointwise")
        if fn is not None:
            return fn(x, packed, bias, "none", [None], "")
    return torch.nn.functional.linear(x, weight, bias)


def _cpuinfo_flags(path: Path = Path("/proc/cpuinfo")) -> set[str]:
    """CPU feature flags of the first processor in /proc/cpuinfo (empty set when unreadable)."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith("flags"):
                return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def cpu_has_native_bf16() -> bool:
    """True when the CPU computes bf16 natively (AVX512-BF16 or AMX tiles). torch.cpu's private
    probes when present; fallback: the kernel's /proc/cpuinfo flags (False when unknown)."""
    avx512_bf16 = private(torch.cpu, "_is_avx512_bf16_supported")
    amx = private(torch.cpu, "_is_amx_tile_supported")
    if avx512_bf16 is not None and amx is not None:
        try:
            return bool(avx512_bf16()) or bool(amx())
        except RuntimeError:
            pass
    flags = _cpuinfo_flags()
    return "avx512_bf16" in flags or "amx_tile" in flags


@dataclass(frozen=True, slots=True)
class OpSchema:
    """One registered operator overload: `ns::name.overload(arg types...)`."""

    name: str  # "ns::op"
    overload: str  # "" for the default overload
    arg_types: tuple[tuple[str, str], ...]  # (argument name, type as torch prints it: "int", "Optional[Tensor]")
    text: str  # the schema as torch prints it


def _from_function_schema(schema) -> OpSchema:
    return OpSchema(
        schema.name,
        schema.overload_name,
        tuple((a.name, str(a.type)) for a in schema.arguments),
        str(schema),
    )


def registered_schemas(prefix: str, known_ops: Mapping[str, Iterable[str]]) -> list[OpSchema]:
    """Every operator schema of the namespaces whose name starts with `prefix`.

    Private path: torch's registry of all schemas (finds ops nobody told us about). Fallback:
    the overloads of the ops listed in `known_ops` ({namespace: op names}) through `torch.ops`."""
    getter = private(torch._C, "_jit_get_all_schemas")
    if getter is not None:
        try:
            return sorted(
                (_from_function_schema(s) for s in getter() if s.name.split("::")[0].startswith(prefix)),
                key=lambda s: (s.name, s.overload),
            )
        except Exception:  # noqa: BLE001 - a changed private API: use the public walk instead
            pass
    found: list[OpSchema] = []
    for ns, ops in known_ops.items():
        for op in ops:
            packet = getattr(getattr(torch.ops, ns), op)
            for overload in packet.overloads():
                found.append(_from_function_schema(getattr(packet, overload)._schema))
    return sorted(found, key=lambda s: (s.name, s.overload))
