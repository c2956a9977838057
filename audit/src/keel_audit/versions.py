"""Version strings as the audit uses them: torch "X.Y", Python "X.Y", glibc "X.Y[.Z]"."""

from __future__ import annotations

import re
from typing import overload

from .errors import AuditInputError

Version = tuple[int, ...]

_VERSION_RE = re.compile(r"^\d+(\.\d+)*$")


def parse(text: str, what: str = "version") -> Version:
    """Parse "2.10" or "2.10.0" into a tuple; raise AuditInputError naming `what` otherwise."""
    text = text.strip()
    if not _VERSION_RE.match(text):
        raise AuditInputError(f"{what}: expected a version like 2.10, got {text!r}")
    return tuple(int(p) for p in text.split("."))


def key(text: str) -> Version:
    """Sort key of a dotted numeric version string ("3.4.30" -> (3, 4, 30)); no checks (trusted input)."""
    return tuple(int(p) for p in text.split("."))


def is_numeric(text: str) -> bool:
    """True for a dotted numeric version ("2.34"), False for a name like "TM_1" or "PRIVATE"."""
    return _VERSION_RE.match(text) is not None


def minor(v: Version) -> Version:
    """Truncate to (major, minor), padding with zero."""
    return (v + (0, 0))[:2]


@overload
def fmt(v: Version) -> str: ...
@overload
def fmt(v: None) -> None: ...
def fmt(v: Version | None) -> str | None:
    """Render a version tuple as dotted text (None stays None)."""
    return None if v is None else ".".join(str(p) for p in v)


def highest(values: list[str]) -> str | None:
    """The highest of several dotted version strings, or None for an empty list."""
    return max(values, key=key) if values else None
