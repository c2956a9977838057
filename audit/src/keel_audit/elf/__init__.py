"""ELF reading: DT_NEEDED, SONAME, RPATH/RUNPATH, dynamic symbols with binding and GNU version.

The API other verbs build on (the audit's classification, a resolver of undefined symbols against
a candidate torch's libraries):

- `read_elf(bytes | path | RandomAccess) -> ElfInfo`; ElfFormatError (an AuditError, exit 2) when
  the input is not a readable ELF shared object. A wheel member opened with
  `keel_audit.wheelzip.read_member` is a RandomAccess: it is inflated only as far as the reader needs.
- `ElfInfo.undefined` / `ElfInfo.defined`: Symbol(name, binding, version, hidden) tuples, imports
  and exports (default or protected visibility); `ElfInfo.version_needs`: (file, version) pairs.
- `undefined_names` / `defined_names`: the same names as plain strings, for bulk lookups.

Modules: `types` (what every reader returns), `symbols` (bulk decoding of the dynamic tables),
`sections` (the section-header reader), `segments` (the dynamic-segment reader for streamed
members), `fallback` (pyelftools), `reader` (`read_elf`, choosing among them). None imports
a module that imports it back.
"""

from __future__ import annotations

from ..errors import ElfFormatError
from .reader import BytesSource, FileSource, read_elf
from .types import ELF_MAGIC, ElfInfo, RandomAccess, Symbol

__all__ = ["ELF_MAGIC", "BytesSource", "ElfFormatError", "ElfInfo", "FileSource", "RandomAccess", "Symbol", "read_elf"]
