"""Linkage policy as data (data/policy.json) behind a small frozen class."""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .errors import TableError

POLICY_FILE = Path(__file__).parent / "data" / "policy.json"


@dataclass(frozen=True, slots=True)
class Policy:
    """Which torch libraries may be DT_NEEDED, what counts as cudart, shim and THP names."""

    allowed_torch_libraries: tuple[str, ...]
    torch_library_patterns: tuple[str, ...]
    cudart_patterns: tuple[str, ...]
    shim_prefixes: tuple[str, ...]
    python_global_prefixes: tuple[str, ...]
    machines: dict[str, str]

    def forbidden_torch_library(self, needed: str) -> bool:
        """A torch library other than libtorch_cpu.so / libtorch_cuda.so (libc10.so, ...)."""
        if needed in self.allowed_torch_libraries:
            return False
        return any(fnmatch.fnmatch(needed, p) for p in self.torch_library_patterns)

    def is_cudart(self, needed: str) -> bool:
        """A dynamically linked CUDA runtime."""
        return any(fnmatch.fnmatch(needed, p) for p in self.cudart_patterns)

    def is_shim_like(self, name: str) -> bool:
        """An unmangled name in the stable shim's name space."""
        return name.startswith(self.shim_prefixes)

    def is_python_global(self, name: str) -> bool:
        """An unmangled libtorch_python global by prefix (THPVariableClass, THPDtypeType, ...)."""
        return name.startswith(self.python_global_prefixes)


@lru_cache(maxsize=2)
def load_policy(path: Path = POLICY_FILE) -> Policy:
    """Load and validate the shipped policy."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Policy(
            allowed_torch_libraries=tuple(data["allowed_torch_libraries"]),
            torch_library_patterns=tuple(data["torch_library_patterns"]),
            cudart_patterns=tuple(data["cudart_patterns"]),
            shim_prefixes=tuple(data["shim_prefixes"]),
            python_global_prefixes=tuple(data["python_global_prefixes"]),
            machines=dict(data["machines"]),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TableError(f"audit policy {path}: expected the schema-1 policy JSON, got {exc!r}") from None
