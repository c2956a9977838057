"""Policy as data: the severity of every finding code and the linkage rules (data/policy*.json).

`policy.json` is the default for any wheel; `policy-strict.json` (`--strict`) is keel's own release
gate. A policy file may `extend` another (path relative to itself) and override any key; severities
are merged code by code.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .errors import TableError

DATA = Path(__file__).parent / "data"
POLICY_FILE = DATA / "policy.json"
STRICT_FILE = DATA / "policy-strict.json"
SEVERITIES = ("error", "warning", "note")
_KEYS = (
    "allowed_torch_libraries",
    "torch_library_patterns",
    "cudart_patterns",
    "shim_prefixes",
    "python_global_prefixes",
    "machines",
)


@dataclass(frozen=True, slots=True)
class Policy:
    """Severity per finding code; which torch libraries may be DT_NEEDED; cudart, shim and THP names."""

    name: str
    severities: dict[str, str]
    allowed_torch_libraries: tuple[str, ...]
    torch_library_patterns: tuple[str, ...]
    cudart_patterns: tuple[str, ...]
    shim_prefixes: tuple[str, ...]
    python_global_prefixes: tuple[str, ...]
    machines: dict[str, str]

    def severity(self, code: str) -> str:
        """The severity of a finding code; a code the policy does not name is an error."""
        return self.severities.get(code, "error")

    def is_torch_library(self, needed: str) -> bool:
        """libtorch*.so, libc10*.so, ... (any library a torch wheel ships)."""
        return any(fnmatch.fnmatch(needed, p) for p in self.torch_library_patterns)

    def forbidden_torch_library(self, needed: str) -> bool:
        """A torch library the policy does not allow in DT_NEEDED (libc10.so, ...)."""
        return needed not in self.allowed_torch_libraries and self.is_torch_library(needed)

    def is_cudart(self, needed: str) -> bool:
        """A dynamically linked CUDA runtime."""
        return any(fnmatch.fnmatch(needed, p) for p in self.cudart_patterns)

    def is_shim_like(self, name: str) -> bool:
        """An unmangled name in the stable shim's name space."""
        return name.startswith(self.shim_prefixes)

    def is_python_global(self, name: str) -> bool:
        """An unmangled libtorch_python global by prefix (THPVariableClass, THPDtypeType, ...)."""
        return name.startswith(self.python_global_prefixes)


def _read(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """The JSON of a policy file with its `extends` chain merged in (base first)."""
    if path in seen:
        raise TableError(f"audit policy {path}: `extends` loops back to itself")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TableError(f"audit policy {path}: expected readable JSON, got {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != 2:
        raise TableError(f'audit policy {path}: expected a JSON object with "schema": 2')
    base = data.get("extends")
    if base is None:
        return data
    merged = _read((path.parent / base).resolve(), (*seen, path))
    severities = {**merged.get("severities", {}), **data.get("severities", {})}
    return {**merged, **data, "severities": severities}


@lru_cache(maxsize=8)
def load_policy(path: Path = POLICY_FILE) -> Policy:
    """Load and validate a policy file (default: the shipped default policy)."""
    data = _read(Path(path).resolve())
    try:
        severities = dict(data["severities"])
        bad = {k: v for k, v in severities.items() if v not in SEVERITIES}
        if bad:
            raise ValueError(f"severities {bad}; expected one of {', '.join(SEVERITIES)}")
        return Policy(
            name=str(data.get("name", Path(path).stem)),
            severities=severities,
            **{k: dict(data[k]) if k == "machines" else tuple(data[k]) for k in _KEYS},
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise TableError(f"audit policy {path}: expected the schema-2 policy keys, got {exc!r}") from None
