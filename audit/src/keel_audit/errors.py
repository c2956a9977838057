"""Error hierarchy of the audit: every error maps to exit code 2 (could not audit)."""

from __future__ import annotations


class AuditError(Exception):
    """Base class of every error the audit raises."""

    exit_code = 2


class AuditInputError(AuditError):
    """The input (path, wheel, zip entry, distribution name) cannot be audited as given."""


class TableError(AuditError):
    """A shipped data file (symbol table, manylinux table, policy) is missing or malformed."""


class ElfFormatError(AuditError):
    """A file that should be an ELF shared object is not one, or is truncated/malformed."""
