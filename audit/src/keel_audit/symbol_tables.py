"""Shipped data: the torch stable shim table and the CPython limited-API table (JSON beside this file)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import TableError
from .versions import key as version_key

DATA_DIR = Path(__file__).parent / "data"
SHIM_TABLE = DATA_DIR / "torch_shim_symbols.json"
CPYTHON_TABLE = DATA_DIR / "cpython_limited_api.json"
SHIM_PREFIXES = ("aoti_torch_", "torch_", "aoti_")


@dataclass(frozen=True, slots=True)
class ShimTable:
    """Stable C shim symbol -> first torch release ("X.Y") exporting it, and the torch library that
    exports it; header-only torch C++ names -> first release whose torch/headeronly headers have
    them; libtorch_python globals."""

    symbols: dict[str, str]
    python_globals: frozenset[str]
    torch_versions: tuple[str, ...]
    libraries: dict[str, str]
    header_only: dict[str, str]

    def is_header_only(self, path: str, upto: str | None = None) -> bool:
        """A qualified torch name (`c10::BFloat16::x`) one of whose prefixes is header-only (in every
        torch release from `upto` on, when given: `c10::report_overflow` is header-only only since
        2.15, before that libc10 exports it)."""
        parts = path.split("::")
        limit = version_key(upto) if upto else None
        for k in range(2, len(parts) + 1):
            since = self.header_only.get("::".join(parts[:k]))
            if since is not None and (limit is None or version_key(since) <= limit):
                return True
        return False


@dataclass(frozen=True, slots=True)
class CPythonTable:
    """Limited-API symbol -> Python version ("3.Y") that added it."""

    symbols: dict[str, str]


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TableError(f"audit table {path}: expected readable JSON, got {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != 1 or not isinstance(data.get("symbols"), dict):
        raise TableError(f"audit table {path}: expected schema 1 with a 'symbols' object")
    out: dict[str, Any] = data
    return out


@lru_cache(maxsize=4)
def shim_table(path: Path = SHIM_TABLE) -> ShimTable:
    """Load the torch shim table (cached)."""
    data = _load(path)
    symbols = data["symbols"]
    return ShimTable(
        symbols={k: v["since"] if isinstance(v, dict) else v for k, v in symbols.items()},
        python_globals=frozenset(data.get("python_globals", ())),
        torch_versions=tuple(data.get("torch_versions", ())),
        libraries={k: v["library"] for k, v in symbols.items() if isinstance(v, dict) and v.get("library")},
        header_only=dict(data.get("header_only", {})),
    )


@lru_cache(maxsize=4)
def cpython_table(path: Path = CPYTHON_TABLE) -> CPythonTable:
    """Load the CPython limited-API table (cached)."""
    return CPythonTable(symbols=dict(_load(path)["symbols"]))


def is_shim_name(name: str) -> bool:
    """An unmangled C name in the stable shim's name space (`aoti_torch_*`, `torch_*`)."""
    return name.startswith(SHIM_PREFIXES)


def is_cpython_name(name: str) -> bool:
    """A CPython C-API name (functions and data: Py*, _Py*, PY*, _PY*)."""
    return name.startswith(("Py", "_Py", "PY", "_PY"))
