"""keel audit: read every ELF object of a wheel and decide whether it survives a torch upgrade.

Only relative imports, stdlib and pyelftools: setup.py loads this package by file path before
keel's native libraries exist.

Wheel members are inflated only up to the end of their dynamic segment when that is enough
(elfdyn.py), so their zip CRC is then not checked (pip checks RECORD hashes at install); the
full-read fallback checks it.
"""

from __future__ import annotations

from .analysis import audit
from .errors import AuditError, AuditInputError, TableError
from .models import SCHEMA, Finding, LibraryAudit, PackageAudit

__all__ = [
    "SCHEMA",
    "AuditError",
    "AuditInputError",
    "Finding",
    "LibraryAudit",
    "PackageAudit",
    "TableError",
    "audit",
]
