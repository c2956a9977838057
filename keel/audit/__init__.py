"""keel audit: read every ELF object of a wheel and decide whether it survives a torch upgrade.

Only relative imports, stdlib and pyelftools: setup.py loads this package by file path before
keel's native libraries exist.
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
