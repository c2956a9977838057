"""keel-audit: read every ELF object of a wheel and decide whether it survives a torch upgrade.

A distribution of its own (`pip install ./audit`): it needs pyelftools and packaging, never torch
or keel. keel's setup.py imports the installed package to gate its build.

Wheel members are inflated only up to the end of their dynamic segment when that is enough
(elf/segments.py), so their zip CRC is then not checked (pip checks RECORD hashes at install); the
full-read fallback checks it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import AuditError, AuditInputError, ElfFormatError, TableError

if TYPE_CHECKING:
    from .analysis import audit
    from .result import SCHEMA, Finding, LibraryAudit, PackageAudit

# The binary audit (pyelftools, the symbol tables) loads on first use: `keel-audit inventory` on one changed
# file, a pre-commit hook, never needs it.
_LAZY = {
    "audit": "analysis",
    "SCHEMA": "result",
    "Finding": "result",
    "LibraryAudit": "result",
    "PackageAudit": "result",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SCHEMA",
    "AuditError",
    "AuditInputError",
    "ElfFormatError",
    "Finding",
    "LibraryAudit",
    "PackageAudit",
    "TableError",
    "audit",
]
