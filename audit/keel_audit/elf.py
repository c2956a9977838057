"""ELF reading: DT_NEEDED, RPATH/RUNPATH, dynamic symbols with binding and version.

The common case (section headers with .dynamic and .dynsym) is read with struct/array in bulk;
objects without them go through pyelftools (`elfslow.py`). Streamed wheel members are first read
from PT_DYNAMIC alone (`elfdyn.py`), so the member is inflated only as far as that needs.
"""

from __future__ import annotations

import array
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import compress
from pathlib import Path
from typing import NamedTuple, Protocol

from elftools.elf.enums import ENUM_E_MACHINE, ENUM_E_TYPE

from .errors import AuditError

ELF_MAGIC = b"\x7fELF"
BINDINGS = {1: "global", 2: "weak", 10: "unique"}
_MACHINES = {v: k for k, v in ENUM_E_MACHINE.items() if k != "_default_"}
_TYPES = {v: k for k, v in ENUM_E_TYPE.items() if k != "_default_"}
_SHT_DYNAMIC, _SHT_NOBITS, _SHT_DYNSYM = 6, 8, 11
_SHT_VERDEF, _SHT_VERNEED, _SHT_VERSYM = 0x6FFFFFFD, 0x6FFFFFFE, 0x6FFFFFFF


class ElfFormatError(AuditError):
    """A file that should be an ELF shared object is not one, or is truncated/malformed."""


class Symbol(NamedTuple):
    """One dynamic symbol: name, binding ("global"/"weak"/"unique") and GNU version, if any."""

    name: str
    binding: str
    version: str | None = None


# (0/1 selection mask over .dynsym, binding code per entry (1/2/10), native u16 .gnu.version per entry)
SymbolExtra = tuple[bytes, bytes, bytes]


@dataclass(frozen=True, slots=True)
class ElfInfo:
    """What the audit needs from one ELF shared object; names are plain strings (the hot path)."""

    machine: str
    soname: str | None
    needed: tuple[str, ...]
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]
    undefined_names: tuple[str, ...]
    defined_names: tuple[str, ...]
    version_needs: tuple[tuple[str, str], ...]  # (providing file, version name)
    undefined_extra: SymbolExtra = field(default=(b"", b"", b""), repr=False)
    defined_extra: SymbolExtra = field(default=(b"", b"", b""), repr=False)
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
        tags: tuple[str | None, tuple[str, ...], tuple[str, ...], tuple[str, ...]],
        symbols: tuple[tuple[str, ...], tuple[str, ...], SymbolExtra, SymbolExtra],
        needs: list[tuple[str, str]],
        version_names: dict[int, str],
    ) -> ElfInfo:
        """One ElfInfo from what every reader produces: (soname, needed, rpath, runpath) dynamic
        tags, (undefined, defined, undefined extra, defined extra) symbols, version needs and names."""
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
        return tuple(Symbol(n, BINDINGS[b], vget(v & 0x7FFF)) for n, b, v in picked)


class _Shdr(NamedTuple):
    index: int
    type: int
    offset: int
    size: int
    link: int
    info: int


class RandomAccess(Protocol):
    """Anything with a size and positional reads (short at the end), e.g. a streamed wheel member.

    A source with a true `streamed` attribute is read from its dynamic segment first (elfdyn.py);
    when that falls back, its last byte is read too (a wheel member's CRC is checked at its end).
    """

    size: int

    def read(self, offset: int, size: int) -> bytes: ...


def read_elf(source: bytes | str | os.PathLike[str] | RandomAccess) -> ElfInfo:
    """Read an ELF shared object from bytes, a path or a RandomAccess; ElfFormatError when it is not one."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _read(_BytesReader(bytes(source) if not isinstance(source, bytes) else source))
    if not isinstance(source, (str, os.PathLike)):
        return _read(source)
    with open(source, "rb") as fh:
        return _read(_FileReader(fh, Path(source).stat().st_size))


class _BytesReader:
    """Random access to an in-memory object."""

    def __init__(self, data: bytes) -> None:
        self.data, self.size = data, len(data)

    def read(self, offset: int, size: int) -> bytes:
        return self.data[offset : offset + size]


class _FileReader:
    """Random access to an open file."""

    def __init__(self, fh: object, size: int) -> None:
        self.fh, self.size = fh, size

    def read(self, offset: int, size: int) -> bytes:
        self.fh.seek(offset)  # type: ignore[attr-defined]
        return self.fh.read(size)  # type: ignore[attr-defined]


def _read(src: RandomAccess) -> ElfInfo:
    head = src.read(0, 64)
    if head[:4] != ELF_MAGIC:
        raise ElfFormatError(f"not an ELF file: expected magic 7f454c46, got {head[:4].hex() or 'empty file'}")
    if len(head) < 52 or head[4] not in (1, 2) or head[5] not in (1, 2) or (head[4] == 2 and len(head) < 64):
        return _slow(src)  # odd class/encoding or a stub header: let pyelftools word the error
    streamed = getattr(src, "streamed", False)
    if streamed:
        from .elfdyn import read_dynamic  # imports this module

        info = read_dynamic(src, head)
        if info is not None:
            return info
    try:
        info = _fast(src, head)
    except (struct.error, ValueError, IndexError, KeyError, OverflowError) as exc:
        raise ElfFormatError(f"truncated or malformed ELF: {exc or type(exc).__name__}") from None
    if streamed:  # the fallback inflates the whole member, so zipfile checks its CRC
        src.read(src.size - 1, 1)
    return info


def _slow(src: RandomAccess) -> ElfInfo:
    from .elfslow import read_with_pyelftools

    return read_with_pyelftools(src.read(0, src.size))


def _fast(src: RandomAccess, head: bytes) -> ElfInfo:
    is64, e = head[4] == 2, "<" if head[5] == 1 else ">"
    fields = struct.unpack_from(e + ("HHIQQQIHHHHHH" if is64 else "HHIIIIIHHHHHH"), head, 16)
    e_type, e_machine, _v, _entry, phoff, shoff, _fl, _eh, phentsize, phnum, shentsize, shnum, shstrndx = fields
    if e_type != 3:
        raise ElfFormatError(f"not a shared object: expected e_type ET_DYN, got {_TYPES.get(e_type, e_type)}")
    size = src.size
    ph = _table(src, phoff, phnum, phentsize, e + ("IIQQQQQQ" if is64 else "IIIIIIII"), "program headers")
    for p in ph:  # (p_type, p_flags, p_offset, .., p_filesz) or (p_type, p_offset, .., p_filesz)
        offset, filesz = (p[2], p[5]) if is64 else (p[1], p[4])
        if p[0] == 1 and offset + filesz > size:  # PT_LOAD
            raise ElfFormatError(f"truncated ELF: a PT_LOAD segment ends past the file size {size}")
    sh = _table(src, shoff, shnum, shentsize, e + ("IIQQQQIIQQ" if is64 else "IIIIIIIIII"), "section headers")
    secs = [_Shdr(i, s[1], s[4], s[5], s[6], s[7]) for i, s in enumerate(sh)]
    for sec in secs:
        if sec.type != _SHT_NOBITS and sec.offset + sec.size > size:
            raise ElfFormatError(f"truncated ELF: section {sec.index} ends past the file size {size}")
    by_type = {}
    for sec in reversed(secs):  # the first section of each type wins
        by_type[sec.type] = sec
    dyn, dynsym = by_type.get(_SHT_DYNAMIC), by_type.get(_SHT_DYNSYM)
    if dyn is None or dynsym is None or (shnum and not shstrndx < shnum and shstrndx != 0xFFFF):
        return _slow(src)
    if not 0 < dynsym.link < len(secs):
        raise ElfFormatError(f"malformed ELF: .dynsym links to section {dynsym.link}")

    def strings(sec: _Shdr) -> bytes:
        if not 0 < sec.link < len(secs):
            raise ElfFormatError(f"malformed ELF: section {sec.index} links to section {sec.link}")
        return _section(src, secs[sec.link])

    from .elfsyms import dynamic_tags, dynsym_names  # imports this module

    tags = dynamic_tags(_section(src, dyn), strings(dyn), e, is64)
    vnames, needs = _versions(src, secs, strings, e)
    versym = _section(src, by_type[_SHT_VERSYM]) if _SHT_VERSYM in by_type else b""
    syms = dynsym_names(_section(src, dynsym), _section(src, secs[dynsym.link]), versym, e, is64)
    return ElfInfo.assemble(_MACHINES.get(e_machine, e_machine), tags, syms, needs, vnames)  # type: ignore[arg-type]


def _table(src: RandomAccess, offset: int, count: int, entsize: int, fmt: str, what: str) -> list:
    """`count` fixed-size header entries at `offset`; ElfFormatError when they end past the file."""
    if not count:
        return []
    if offset + count * entsize > src.size or entsize < struct.calcsize(fmt):
        raise ElfFormatError(f"truncated ELF: {what} end past the file size {src.size}")
    raw = src.read(offset, count * entsize)
    return [struct.unpack_from(fmt, raw, i * entsize) for i in range(count)]


def _section(src: RandomAccess, sec: _Shdr) -> bytes:
    """One section's bytes; ElfFormatError when the file holds fewer bytes than declared."""
    data = src.read(sec.offset, sec.size)
    if len(data) != sec.size:
        raise ElfFormatError(f"truncated ELF: section needs {sec.size} bytes, file has {len(data)}")
    return data


def _versions(
    src: RandomAccess, secs: list[_Shdr], strings: Callable[[_Shdr], bytes], e: str
) -> tuple[dict[int, str], list[tuple[str, str]]]:
    """Version index -> name (verneed, verdef) and every (file, version) needed, in section order."""
    from .elfsyms import walk_versions

    names: dict[int, str] = {}
    needs: list[tuple[str, str]] = []
    for sec in secs:
        if sec.type in (_SHT_VERNEED, _SHT_VERDEF):
            walk_versions(_section(src, sec), strings(sec), sec.type == _SHT_VERNEED, sec.info, e, names, needs)
    return names, needs
