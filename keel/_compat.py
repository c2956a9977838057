"""The one place where keel touches private torch APIs; each use has a tested fallback.

A torch upgrade may remove or change anything underscored. Every helper here tries the private
API first (faster or more complete) and falls back to public behaviour, so a missing private
API costs speed or detail, never a crash.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch


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
    getter = getattr(torch._C, "_jit_get_all_schemas", None)
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
