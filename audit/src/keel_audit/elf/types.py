"""What every ELF reader produces: ElfInfo (dynamic tags, symbols, version needs) and its pieces."""

from __future__ import annotations

import array
from dataclasses import dataclass, field
from itertools import compress
from typing import NamedTuple, Protocol

from elftools.elf.enums import ENUM_E_MACHINE, ENUM_E_TYPE

ELF_MAGIC = b"\x7fELF"
BINDINGS = {1: "global", 2: "weak", 10: "unique"}
_MACHINES: dict[int, str] = {v: k for k, v in ENUM_E_MACHINE.items() if k != "_default_"}
_TYPES: dict[int, str] = {v: k for k, v in ENUM_E_TYPE.items() if k != "_default_"}
# the most bytes any reader reads at once (one section, one table): about 12x the largest dynamic section of
# torch's libraries (libtorch_cpu.so's .dynstr, 5 MB); a larger one is a damaged or hostile object
MAX_READ = 64 << 20
# the most dynamic-section entries before DT_NULL any reader walks (torch's libraries have under 60)
MAX_DYNAMIC_TAGS = 1 << 12
# the only section/program header sizes the ELF specification defines, (32-bit, 64-bit)
SHDR_SIZE, PHDR_SIZE = (40, 64), (32, 56)
VERSYM_HIDDEN = 0x8000  # .gnu.version bit: not the default version (`name@V`, not `name@@V`)


def machine_name(e_machine: int | str) -> str:
    """`EM_X86_64` for a known e_machine value; the number as text for one pyelftools does not name."""
    return e_machine if isinstance(e_machine, str) else _MACHINES.get(e_machine, str(e_machine))


def type_name(e_type: int) -> str:
    """`ET_DYN` for a known e_type value; the number as text otherwise."""
    return _TYPES.get(e_type, str(e_type))


class Symbol(NamedTuple):
    """One dynamic symbol: name, binding ("global"/"weak"/"unique") and GNU version, if any.

    `hidden` is the .gnu.version hidden bit: for a definition, a non-default version (`name@V`,
    which an unversioned reference never binds to); the default one is `name@@V`.
    """

    name: str
    binding: str
    version: str | None = None
    hidden: bool = False


# (0/1 selection mask over .dynsym, binding code per entry (1/2/10), native u16 .gnu.version per entry)
SymbolExtra = tuple[bytes, bytes, bytes]
NO_EXTRA: SymbolExtra = (b"", b"", b"")
# (soname, needed, rpath, runpath) from the dynamic section
DynamicTags = tuple[str | None, tuple[str, ...], tuple[str, ...], tuple[str, ...]]
# (undefined names, exported names, undefined extra, exported extra) from .dynsym
DynamicSymbols = tuple[tuple[str, ...], tuple[str, ...], SymbolExtra, SymbolExtra]


@dataclass(frozen=True, slots=True)
class ElfInfo:
    """What the audit needs from one ELF shared object; names are plain strings (the hot path).

    `undefined` / `defined` build Symbol tuples (with versions) on demand; `version_needs` lists
    every (providing file, version name) of .gnu.version_r in section order.
    """

    machine: str
    soname: str | None
    needed: tuple[str, ...]
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]
    undefined_names: tuple[str, ...]
    defined_names: tuple[str, ...]
    version_needs: tuple[tuple[str, str], ...]  # (providing file, version name)
    undefined_extra: SymbolExtra = field(default=NO_EXTRA, repr=False)
    defined_extra: SymbolExtra = field(default=NO_EXTRA, repr=False)
    version_names: tuple[tuple[int, str], ...] = field(default=(), repr=False)

    @property
    def undefined(self) -> tuple[Symbol, ...]:
        """Undefined dynamic symbols as Symbol tuples (built on demand)."""
        return self._symbols(self.undefined_names, self.undefined_extra)

    @property
    def defined(self) -> tuple[Symbol, ...]:
        """Exported (default/protected visibility) dynamic symbols as Symbol tuples."""
        return self._symbols(self.defined_names, self.defined_extra)

    @classmethod
    def assemble(
        cls,
        machine: str,
        tags: DynamicTags,
        symbols: DynamicSymbols,
        needs: list[tuple[str, str]],
        version_names: dict[int, str],
    ) -> ElfInfo:
        """One ElfInfo from what every reader produces: dynamic tags, .dynsym symbols, version needs
        and the version index -> name map (verneed and verdef)."""
        soname, needed, rpath, runpath = tags
        und, dfn, und_x, dfn_x = symbols
        return cls(
            machine=machine,
            soname=soname,
            needed=tuple(needed),
            rpath=tuple(rpath),
            runpath=tuple(runpath),
            undefined_names=und,
            defined_names=dfn,
            version_needs=tuple(needs),
            undefined_extra=und_x,
            defined_extra=dfn_x,
            version_names=tuple(sorted(version_names.items())),
        )

    def _symbols(self, names: tuple[str, ...], extra: SymbolExtra) -> tuple[Symbol, ...]:
        vget = dict(self.version_names).get
        select, binds, vers = extra
        versions = array.array("H", vers)
        picked = zip(names, compress(binds, select), compress(versions, select), strict=True)
        return tuple(Symbol(n, BINDINGS[b], vget(v & 0x7FFF), bool(v & VERSYM_HIDDEN)) for n, b, v in picked)


class RandomAccess(Protocol):
    """Anything with a size and positional reads (short at the end), e.g. a streamed wheel member.

    A source with a true `streamed` attribute is read from its dynamic segment first (segments.py);
    when that falls back, its last byte is read too (a wheel member's CRC is checked at its end).
    """

    @property
    def size(self) -> int: ...

    def read(self, offset: int, size: int, /) -> bytes: ...
