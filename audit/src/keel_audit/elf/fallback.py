"""The pyelftools fallback, for the rare objects the bulk reader leaves alone (no .dynamic/.dynsym
sections, an odd ELF class or encoding): slower, and it words the errors of odd headers.

pyelftools reads through a file object over the RandomAccess (`SourceStream`): only the headers and
tables it parses are read, each read at most MAX_READ bytes. Its work is bounded too, since it parses one
object per entry: the dynamic entries are counted in bulk before pyelftools walks them (it walks to DT_NULL,
past the segment's end if need be), and at most MAX_SYMBOLS symbols and MAX_VERSIONS version entries are
walked, so a sparse 10 GB object, a member of GBs or a table of millions of entries costs about what a
small object does."""

from __future__ import annotations

import io
import os
import struct

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection, DynamicSegment, DynamicTag
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection

from ..errors import ElfFormatError
from .symbols import check_dynamic_count, dynsym_names
from .types import (
    MAX_DYNAMIC_TAGS,
    MAX_READ,
    NO_EXTRA,
    DynamicSymbols,
    ElfInfo,
    RandomAccess,
    SymbolExtra,
    machine_name,
)

_SHT_DYNSYM, _SHT_VERSYM = 11, 0x6FFFFFFF
MAX_SYMBOLS = 1 << 17  # dynamic symbols walked without .dynsym (libtorch_cpu.so has about 75,000)
MAX_VERSIONS = 1 << 16  # version needs and definitions walked


class SourceStream(io.RawIOBase):
    """A read-only, seekable file object over a RandomAccess; one read returns at most MAX_READ bytes
    (pyelftools asks for a section's whole size: a larger one is a damaged object)."""

    def __init__(self, src: RandomAccess) -> None:
        super().__init__()
        self.src, self.pos = src, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.src.size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self.pos = base + offset
        return self.pos

    def read(self, size: int | None = -1, /) -> bytes:
        left = max(self.src.size - self.pos, 0)
        n = left if size is None or size < 0 else min(size, left)
        if n > MAX_READ:
            raise ElfFormatError(
                f"malformed ELF: a table of {n} bytes at offset {self.pos}; expected at most {MAX_READ}"
            )
        data = self.src.read(self.pos, n) if n else b""
        self.pos += len(data)
        return data

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def read_with_pyelftools(src: bytes | RandomAccess) -> ElfInfo:
    """Parse with pyelftools (a RandomAccess read in pieces); every pyelftools/construct failure becomes
    ElfFormatError."""
    try:
        stream: io.BytesIO | io.BufferedReader
        stream = io.BytesIO(src) if isinstance(src, bytes) else io.BufferedReader(SourceStream(src), 1 << 16)
        elf = ELFFile(stream)
        if elf["e_type"] != "ET_DYN":
            raise ElfFormatError(f"not a shared object: expected e_type ET_DYN, got {elf['e_type']}")
        return _collect(elf)
    except (ELFError, struct.error, ValueError, EOFError, IndexError, KeyError, OverflowError) as exc:
        raise ElfFormatError(f"truncated or malformed ELF: {exc or type(exc).__name__}") from None
    except Exception as exc:  # construct errors from pyelftools have no common public base
        if type(exc).__module__.startswith(("elftools", "construct")):
            raise ElfFormatError(f"truncated or malformed ELF: {exc}") from None
        raise


def _collect(elf: ELFFile) -> ElfInfo:
    needed: list[str] = []
    rpath: list[str] = []
    runpath: list[str] = []
    soname = None
    dynamic: DynamicSection | DynamicSegment | None
    dynamic = next((s for s in elf.iter_sections() if isinstance(s, DynamicSection)), None)
    if dynamic is None:
        dynamic = next((s for s in elf.iter_segments() if isinstance(s, DynamicSegment)), None)
    if dynamic is not None:
        _check_tag_count(elf, dynamic)
        for tag in dynamic.iter_tags():
            kind = tag.entry.d_tag
            if kind == "DT_NEEDED":
                needed.append(_text(tag, "needed"))
            elif kind == "DT_RPATH":
                rpath.extend(p for p in _text(tag, "rpath").split(":") if p)
            elif kind == "DT_RUNPATH":
                runpath.extend(p for p in _text(tag, "runpath").split(":") if p)
            elif kind == "DT_SONAME":
                soname = _text(tag, "soname")
    names, needs = _versions(elf)
    tags = (soname, tuple(needed), tuple(rpath), tuple(runpath))
    return ElfInfo.assemble(machine_name(elf["e_machine"]), tags, _symbols(elf, dynamic), needs, names)


def _check_tag_count(elf: ELFFile, dynamic: DynamicSection | DynamicSegment) -> None:
    """Count the entries pyelftools would walk (from the table's start to DT_NULL) in one bulk read first:
    more than MAX_DYNAMIC_TAGS is a malformed object, refused before pyelftools parses them one by one."""
    if isinstance(dynamic, DynamicSection):
        offset, empty = dynamic["sh_offset"], dynamic["sh_type"] == "SHT_NOBITS"
    else:
        offset, empty = dynamic["p_offset"], dynamic["p_filesz"] == 0
    if empty:  # (pyelftools walks none)
        return
    ent = elf.structs.Elf_Dyn.sizeof()
    elf.stream.seek(offset)
    raw = elf.stream.read((MAX_DYNAMIC_TAGS + 1) * ent)
    is64, e = elf.elfclass == 64, "<" if elf.little_endian else ">"
    if len(raw) // ent <= MAX_DYNAMIC_TAGS and not any(
        t == 0 for (t,) in struct.iter_unpack(e + ("q8x" if is64 else "i4x"), raw[: len(raw) // ent * ent])
    ):
        raise ElfFormatError(f"truncated ELF: the dynamic table at offset {offset} ends before its DT_NULL")
    check_dynamic_count(raw, e, is64)


def _versions(elf: ELFFile) -> tuple[dict[int, str], list[tuple[str, str]]]:
    """Version names by index and (file, version) needs, at most MAX_VERSIONS entries walked."""
    names: dict[int, str] = {}
    needs: list[tuple[str, str]] = []
    walked = 0
    for sec in elf.iter_sections():
        if not isinstance(sec, GNUVerNeedSection | GNUVerDefSection):
            continue
        for entry, auxes in sec.iter_versions():
            for k, aux in enumerate(auxes):
                walked += 1
                if walked > MAX_VERSIONS:
                    raise ElfFormatError(f"malformed ELF: more than {MAX_VERSIONS} version entries")
                if isinstance(sec, GNUVerNeedSection):
                    names[aux["vna_other"]] = aux.name
                    needs.append((entry.name or "", aux.name))
                elif k == 0 and not entry["vd_flags"] & 0x1:  # a definition's first name; skip VER_FLG_BASE
                    names[entry["vd_ndx"]] = aux.name
                else:
                    break
    return names, needs


def _text(tag: DynamicTag, name: str) -> str:
    """The string pyelftools attaches to a DT_NEEDED/DT_RPATH/DT_RUNPATH/DT_SONAME tag."""
    return str(vars(tag)[name])


def _symbols(elf: ELFFile, dynamic: object) -> DynamicSymbols:
    """From .dynsym when there is one, else by walking DT_SYMTAB."""
    dynsym = next((s for s in elf.iter_sections() if s["sh_type"] == "SHT_DYNSYM"), None)
    if dynsym is not None:
        link = dynsym["sh_link"]
        if not 0 < link < elf.num_sections():
            raise ElfFormatError(f"malformed ELF: .dynsym links to section {link}")
        versym = next((s.data() for s in elf.iter_sections() if s["sh_type"] == "SHT_GNU_versym"), b"")
        endian = "<" if elf.little_endian else ">"
        return dynsym_names(dynsym.data(), elf.get_section(link).data(), versym, endian, elf.elfclass == 64)
    if not isinstance(dynamic, DynamicSegment):
        return (), (), NO_EXTRA, NO_EXTRA
    undefined: list[tuple[str, int]] = []
    defined: list[tuple[str, int]] = []
    binds = {"STB_GLOBAL": 1, "STB_WEAK": 2, "STB_GNU_UNIQUE": 10}
    for sym in dynamic.iter_symbols():
        binding = binds.get(sym["st_info"]["bind"])
        if binding is None or not sym.name:
            continue
        target = undefined if sym["st_shndx"] == "SHN_UNDEF" else defined
        target.append((sym.name, binding))
        if len(undefined) + len(defined) > MAX_SYMBOLS:
            raise ElfFormatError(f"malformed ELF: more than {MAX_SYMBOLS} dynamic symbols; expected a real object")

    def extra(syms: list[tuple[str, int]]) -> SymbolExtra:  # no versions without .gnu.version
        return b"\1" * len(syms), bytes(b for _, b in syms), bytes(2 * len(syms))

    return tuple(n for n, _ in undefined), tuple(n for n, _ in defined), extra(undefined), extra(defined)
