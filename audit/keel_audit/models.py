"""Frozen results of an audit: findings, one LibraryAudit per ELF object, one PackageAudit."""

from __future__ import annotations

from dataclasses import dataclass

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
        from .render import render_table

        return render_table(self)

    def to_json(self) -> dict:
        """The versioned JSON document (schema `keel-audit/1`)."""
        from .render import to_json

        return to_json(self)
