"""keel-audit: read every ELF object of a wheel and decide whether it survives a torch upgrade.

A distribution of its own (`pip install ./audit`): it needs pyelftools and packaging, never torch
or keel. keel's setup.py imports the installed package to gate its build.

Wheel members are inflated only up to the end of their dynamic segment when that is enough
(elf/segments.py), so their zip CRC is then not checked (pip checks RECORD hashes at install); the
full-read fallback checks it.
"""

from __future__ import annotations

from .analysis import audit
from .errors import AuditError, AuditInputError, ElfFormatError, TableError
from .result import SCHEMA, Finding, LibraryAudit, PackageAudit

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
