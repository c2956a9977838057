"""Policy as data: the severity of every finding code and the linkage rules (data/policy*.json).

`policy.json` is the default for any wheel; `policy-strict.json` (`--strict`) is keel's own release
gate. A policy file may `extend` another (path relative to itself) and override any key; severities
are merged code by code.
"""

from __future__ import annotations

import fnmatch
import json
import os
import stat
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import TableError

DATA = Path(__file__).parent / "data"
POLICY_FILE = DATA / "policy.json"
STRICT_FILE = DATA / "policy-strict.json"
SEVERITIES = ("error", "warning", "note")
MAX_POLICY_BYTES = 1 << 20  # a policy file is a few KB; a larger one is not a policy


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


def _read(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The JSON of a policy file with its `extends` chain merged in (base first); TableError naming the
    file (and the file that extends it) for anything that is not a readable schema-2 policy object."""
    where = f"audit policy {path}" + (f" (extended by {seen[-1]})" if seen else "")
    if path in seen:
        raise TableError(f"{where}: `extends` loops back to itself")
    data = _load_json(path, where)
    if not isinstance(data, dict) or data.get("schema") != 2:
        raise TableError(f'{where}: expected a JSON object with "schema": 2')
    for key in ("severities", "machines"):
        if not isinstance(data.get(key, {}), dict):
            raise TableError(f"{where}: {key} must be a JSON object, got {type(data[key]).__name__}")
    base = data.get("extends")
    if base is None:
        return data
    if not isinstance(base, str) or not base:
        raise TableError(f"{where}: extends must be the path of another policy file, got {base!r:.80}")
    merged = _read((path.parent / base).resolve(), (*seen, path))
    severities = {**merged.get("severities", {}), **data.get("severities", {})}
    out: dict[str, Any] = {**merged, **data, "severities": severities}
    return out


def _load_json(path: Path, where: str) -> Any:
    """The parsed JSON of a regular file of at most MAX_POLICY_BYTES (no device, FIFO or huge file is
    read; nesting too deep for the parser is an error, not a crash)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise TableError(f"{where}: cannot open ({exc.strerror or exc}); expected a readable JSON file") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TableError(f"{where}: not a regular file; expected a JSON file")
        if info.st_size > MAX_POLICY_BYTES:
            raise TableError(f"{where}: {info.st_size} bytes; expected a policy of at most {MAX_POLICY_BYTES} bytes")
        with os.fdopen(os.dup(fd), "rb") as fh:
            raw = fh.read(MAX_POLICY_BYTES + 1)
    except OSError as exc:
        raise TableError(f"{where}: cannot read ({exc.strerror or exc}); expected a readable JSON file") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_POLICY_BYTES:
        raise TableError(f"{where}: more than {MAX_POLICY_BYTES} bytes; expected a policy file")
    try:
        return json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise TableError(f"{where}: JSON nested too deeply; expected a flat policy object") from None
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise TableError(f"{where}: expected readable UTF-8 JSON, got {exc}") from None


def _strings(data: dict[str, Any], key: str) -> tuple[str, ...]:
    """A list of strings of the policy (KeyError when missing, TypeError when not a list of strings)."""
    value = data[key]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{key}: expected a list of strings, got {value!r}")
    return tuple(value)


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
            allowed_torch_libraries=_strings(data, "allowed_torch_libraries"),
            torch_library_patterns=_strings(data, "torch_library_patterns"),
            cudart_patterns=_strings(data, "cudart_patterns"),
            shim_prefixes=_strings(data, "shim_prefixes"),
            python_global_prefixes=_strings(data, "python_global_prefixes"),
            machines={str(k): str(v) for k, v in dict(data["machines"]).items()},
        )
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise TableError(f"audit policy {path}: expected the schema-2 policy keys, got {exc!r}") from None
