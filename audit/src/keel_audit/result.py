"""Frozen results of an audit: findings, one LibraryAudit per ELF object, one PackageAudit.

`PackageAudit.to_json()` is the versioned document (schema `keel-audit/2`); the readable table
(`render()`) is drawn from that document by render.py, which knows nothing of these classes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .mangling import demangle
from .policy import SEVERITIES
from .render import render_table

SCHEMA = "keel-audit/2"
STABLE, UNSTABLE, NO_TORCH, INVALID = "STABLE", "UNSTABLE", "NO-TORCH", "INVALID"


@dataclass(frozen=True, slots=True)
class Finding:
    """One finding: `error` fails the gate, `warning` is shown and counted, `note` is shown.

    The severity comes from the policy (data/policy*.json) by `code`.
    """

    code: str
    library: str | None
    message: str
    symbols: tuple[str, ...] = ()
    severity: str = ""  # "" until the policy sets it (analysis.py)

    @property
    def fatal(self) -> bool:
        """Fails the gate."""
        return self.severity == "error"


@dataclass(frozen=True, slots=True)
class LibraryAudit:
    """What one ELF shared object needs from torch, CPython and the platform."""

    path: str
    verdict: str
    error: str | None = None
    machine: str | None = None
    needed: tuple[str, ...] = ()
    runpath: tuple[str, ...] = ()
    torch_floor: str | None = None
    floor_symbols: tuple[str, ...] = ()
    python_floor: str | None = None
    abi3: bool = False
    glibc_max: str | None = None
    glibcxx_max: str | None = None
    cxxabi_max: str | None = None
    gcc_max: str | None = None
    # oldest manylinux policy (glibc "X.Y") admitting every GLIBC_/GLIBCXX_/CXXABI_/GCC_ version
    # needed (manylinux.py); None without such needs, or when some are above every known policy
    manylinux_floor: str | None = None
    manylinux_excess: tuple[str, ...] = ()  # those above every known policy (or all: unknown arch)
    named_versions: tuple[str, ...] = ()  # non-numeric ones of those families (CXXABI_TM_1, ...)
    shim_symbols: tuple[tuple[str, str], ...] = ()
    unknown_shim: tuple[str, ...] = ()
    unstable_undefined: tuple[str, ...] = ()
    unstable_exported: tuple[str, ...] = ()
    header_only_exported: tuple[str, ...] = ()
    header_only_imported: tuple[str, ...] = ()
    cpython_limited: int = 0
    cpython_nonlimited: tuple[str, ...] = ()
    other: int = 0
    allowed: bool = False

    @property
    def unstable_symbols(self) -> tuple[str, ...]:
        """Every unstable reference: imports from libtorch, then compiled-in unstable layouts (definitions)."""
        return self.unstable_undefined + self.unstable_exported


@dataclass(frozen=True, slots=True)
class PackageAudit:
    """The audit of a whole input (wheel, directory, files); truthy when the gate passed."""

    sources: tuple[str, ...]
    tags: tuple[str, ...]
    libraries: tuple[LibraryAudit, ...]
    findings: tuple[Finding, ...]
    verdict: str
    torch_floor: str | None
    python_floor: str | None
    glibc_max: str | None
    manylinux_floor: str | None = None  # newest library floor; None if any library's is unknown
    target_torch: str | None = None
    policy: str = "default"
    allow: tuple[str, ...] = ()
    requires_python: str | None = None

    def count(self, severity: str) -> int:
        """How many findings have this severity."""
        return sum(f.severity == severity for f in self.findings)

    @property
    def exit_code(self) -> int:
        """0 pass, 1 gate failed, 2 could not audit (a library is not a readable ELF object)."""
        if any(lib.verdict == INVALID for lib in self.libraries):
            return 2
        return 1 if any(f.fatal for f in self.findings) else 0

    def __bool__(self) -> bool:
        return self.exit_code == 0

    def render(self) -> str:
        """The readable table."""
        return render_table(self.to_json())

    def to_json(self) -> dict[str, Any]:
        """The versioned JSON document (schema `keel-audit/2`): package verdicts first, then
        libraries and findings (with severities)."""
        libraries = []
        for lib in self.libraries:
            doc = asdict(lib)
            doc["shim_symbols"] = dict(lib.shim_symbols)
            doc["unstable_symbols"] = [{"name": n, "demangled": demangle(n)} for n in lib.unstable_symbols]
            libraries.append(doc)
        return {
            "schema": SCHEMA,
            "passed": bool(self),
            "exit_code": self.exit_code,
            "verdict": self.verdict,
            "torch_floor": self.torch_floor,
            "python_floor": self.python_floor,
            "glibc_max": self.glibc_max,
            "manylinux_floor": self.manylinux_floor,
            "target_torch": self.target_torch,
            "policy": self.policy,
            "counts": {s: self.count(s) for s in SEVERITIES},
            "requires_python": self.requires_python,
            "allow": list(self.allow),
            "sources": list(self.sources),
            "tags": list(self.tags),
            "findings": [{**asdict(f), "fatal": f.fatal} for f in self.findings],
            "libraries": libraries,
        }
