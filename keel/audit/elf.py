"""ELF reading with pyelftools: DT_NEEDED, RPATH/RUNPATH, dynamic symbols with binding and version."""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NamedTuple

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection, DynamicSegment
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection

from .errors import AuditError

ELF_MAGIC = b"\x7fELF"
_BINDINGS = {1: "global", 2: "weak", 10: "unique"}


class ElfFormatError(AuditError):
    """A file that should be an ELF shared object is not one, or is truncated/malformed."""


class Symbol(NamedTuple):
    """One dynamic symbol: name, binding ("global"/"weak"/"unique") and GNU version, if any."""

    name: str
    binding: str
    version: str | None = None


@dataclass(frozen=True, slots=True)
class ElfInfo:
    """What the audit needs from one ELF shared object."""

    machine: str
    soname: str | None
    needed: tuple[str, ...]
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]
    undefined: tuple[Symbol, ...]
    defined: tuple[Symbol, ...]
    version_needs: tuple[tuple[str, str], ...]  # (providing file, version name)


def read_elf(source: bytes | str | Path) -> ElfInfo:
    """Read an ELF shared object from bytes or a path; ElfFormatError when it is not one."""
    if isinstance(source, bytes):
        return _read(io.BytesIO(source), len(source))
    with open(source, "rb") as fh:
        return _read(fh, Path(source).stat().st_size)


class _Shdr(NamedTuple):
    index: int
    type: int
    offset: int
    size: int
    link: int


_SHT_DYNAMIC, _SHT_NOBITS, _SHT_DYNSYM = 6, 8, 11
_SHT_VERDEF, _SHT_VERNEED, _SHT_VERSYM = 0x6FFFFFFD, 0x6FFFFFFE, 0x6FFFFFFF


def _read(stream: BinaryIO, size: int) -> ElfInfo:
    head = stream.read(4)
    if head != ELF_MAGIC:
        raise ElfFormatError(f"not an ELF file: expected magic 7f454c46, got {head.hex() or 'empty file'}")
    stream.seek(0)
    try:
        elf = ELFFile(stream)
        if elf["e_type"] != "ET_DYN":
            raise ElfFormatError(f"not a shared object: expected e_type ET_DYN, got {elf['e_type']}")
        sections = _headers(elf, stream, size)
        return _collect(elf, sections, stream)
    except (ELFError, struct.error, ValueError, EOFError, IndexError, KeyError) as exc:
        raise ElfFormatError(f"truncated or malformed ELF: {exc or type(exc).__name__}") from None
    except Exception as exc:  # construct errors from pyelftools have no common public base
        if type(exc).__module__.startswith(("elftools", "construct")):
            raise ElfFormatError(f"truncated or malformed ELF: {exc}") from None
        raise


def _table(stream: BinaryIO, offset: int, count: int, entsize: int, fmt: str, size: int, what: str) -> list:
    """`count` fixed-size header entries at `offset`; ElfFormatError when they end past the file."""
    if not count:
        return []
    if offset + count * entsize > size or entsize < struct.calcsize(fmt):
        raise ElfFormatError(f"truncated ELF: {what} end past the file size {size}")
    stream.seek(offset)
    raw = stream.read(count * entsize)
    return [struct.unpack_from(fmt, raw, i * entsize) for i in range(count)]


def _headers(elf: ELFFile, stream: BinaryIO, size: int) -> list[_Shdr]:
    """Section headers (type, offset, size, link), bounds-checked together with PT_LOAD segments."""
    hdr, e = elf.header, "<" if elf.little_endian else ">"
    is64 = elf.elfclass == 64
    phdrs = _table(
        stream,
        hdr["e_phoff"],
        hdr["e_phnum"],
        hdr["e_phentsize"],
        e + ("IIQQQQQQ" if is64 else "IIIIIIII"),
        size,
        "program headers",
    )
    for ph in phdrs:  # (p_type, p_flags, p_offset, .., p_filesz) or (p_type, p_offset, .., p_filesz)
        offset, filesz = (ph[2], ph[5]) if is64 else (ph[1], ph[4])
        if ph[0] == 1 and offset + filesz > size:  # PT_LOAD
            raise ElfFormatError(f"truncated ELF: a PT_LOAD segment ends past the file size {size}")
    shdrs = _table(
        stream,
        hdr["e_shoff"],
        hdr["e_shnum"],
        hdr["e_shentsize"],
        e + ("IIQQQQIIQQ" if is64 else "IIIIIIIIII"),
        size,
        "section headers",
    )
    out = [_Shdr(i, sh[1], sh[4], sh[5], sh[6]) for i, sh in enumerate(shdrs)]
    for sec in out:
        if sec.type != _SHT_NOBITS and sec.offset + sec.size > size:
            raise ElfFormatError(f"truncated ELF: section {sec.index} ends past the file size {size}")
    return out


def _collect(elf: ELFFile, sections: list[_Shdr], stream: BinaryIO) -> ElfInfo:
    needed: list[str] = []
    rpath: list[str] = []
    runpath: list[str] = []
    soname = None
    dyn = next((s for s in sections if s.type == _SHT_DYNAMIC), None)
    dynamic = elf.get_section(dyn.index) if dyn is not None else None
    if not isinstance(dynamic, DynamicSection):
        dynamic = next((s for s in elf.iter_segments() if isinstance(s, DynamicSegment)), None)
    if dynamic is not None:
        for tag in dynamic.iter_tags():
            kind = tag.entry.d_tag
            if kind == "DT_NEEDED":
                needed.append(tag.needed)
            elif kind == "DT_RPATH":
                rpath.extend(p for p in tag.rpath.split(":") if p)
            elif kind == "DT_RUNPATH":
                runpath.extend(p for p in tag.runpath.split(":") if p)
            elif kind == "DT_SONAME":
                soname = tag.soname
    version_names, needs = _versions(
        [elf.get_section(s.index) for s in sections if s.type in (_SHT_VERNEED, _SHT_VERDEF)]
    )
    undefined, defined = _symbols(elf, sections, stream, version_names, dynamic)
    return ElfInfo(
        machine=elf["e_machine"],
        soname=soname,
        needed=tuple(needed),
        rpath=tuple(rpath),
        runpath=tuple(runpath),
        undefined=undefined,
        defined=defined,
        version_needs=tuple(needs),
    )


def _versions(sections: list) -> tuple[dict[int, str], list[tuple[str, str]]]:
    """Map version index -> name (verneed and verdef), and list every (file, version) needed."""
    names: dict[int, str] = {}
    needs: list[tuple[str, str]] = []
    for sec in sections:
        if isinstance(sec, GNUVerNeedSection):
            for verneed, auxes in sec.iter_versions():
                for aux in auxes:
                    names[aux["vna_other"]] = aux.name
                    needs.append((verneed.name, aux.name))
        elif isinstance(sec, GNUVerDefSection):
            for verdef, auxes in sec.iter_versions():
                first = next(iter(auxes), None)
                if first is not None and not verdef["vd_flags"] & 0x1:  # skip VER_FLG_BASE
                    names[verdef["vd_ndx"]] = first.name
    return names, needs


def _symbols(
    elf: ELFFile, sections: list, stream: BinaryIO, vnames: dict[int, str], dynamic: object
) -> tuple[tuple[Symbol, ...], tuple[Symbol, ...]]:
    """Undefined and exported dynamic symbols, parsed with struct for speed."""
    dynsym = next((s for s in sections if s.type == _SHT_DYNSYM), None)
    if dynsym is None:
        return _symbols_from_segment(dynamic)
    endian = "<" if elf.little_endian else ">"
    # (st_name, st_info, st_other, st_shndx); value and size are skipped
    fmt = endian + ("IBBH16x" if elf.elfclass == 64 else "I8xBBH")
    entsize = struct.calcsize(fmt)
    raw = _section_bytes(stream, dynsym)
    if not 0 < dynsym.link < len(sections):
        raise ElfFormatError(f"malformed ELF: .dynsym links to section {dynsym.link}")
    strtab = _section_bytes(stream, sections[dynsym.link])
    versym_sec = next((s for s in sections if s.type == _SHT_VERSYM), None)
    versym = _section_bytes(stream, versym_sec) if versym_sec is not None else b""
    count = len(raw) // entsize
    vers = list(struct.unpack(f"{endian}{len(versym) // 2}H", versym[: len(versym) // 2 * 2]))
    vers = vers[:count] + [0] * (count - len(vers))
    if not strtab.endswith(b"\0"):
        raise ElfFormatError("malformed ELF: .dynstr does not end with a NUL byte")
    # latin-1 keeps byte offsets; names are re-decoded as UTF-8 only when not ASCII
    text = strtab.decode("latin-1")
    bindings, vget, find = _BINDINGS, vnames.get, text.find
    rows = [
        (n, bindings[i >> 4], o & 0x3, sh, v & 0x7FFF)
        for (n, i, o, sh), v in zip(struct.iter_unpack(fmt, raw[: count * entsize]), vers, strict=True)
        if n and (i >> 4) in bindings
    ]
    if rows and max(r[0] for r in rows) >= len(text):
        raise ElfFormatError("malformed ELF: a symbol name starts past the end of .dynstr")
    syms = [(Symbol(text[n : find("\0", n)], b, vget(v)), sh, o) for n, b, o, sh, v in rows]
    if not strtab.isascii():
        syms = [
            (s._replace(name=s.name.encode("latin-1").decode("utf-8", "replace")), sh, o) for s, sh, o in syms
        ]
    undefined = [s for s, sh, _ in syms if sh == 0]
    defined = [s for s, sh, o in syms if sh != 0 and o in (0, 3)]  # default or protected visibility
    return tuple(undefined), tuple(defined)


def _symbols_from_segment(dynamic: object) -> tuple[tuple[Symbol, ...], tuple[Symbol, ...]]:
    """Fallback for objects without section headers: walk DT_SYMTAB through pyelftools."""
    if not isinstance(dynamic, DynamicSegment):
        return (), ()
    undefined: list[Symbol] = []
    defined: list[Symbol] = []
    binds = {"STB_GLOBAL": "global", "STB_WEAK": "weak", "STB_GNU_UNIQUE": "unique"}
    for sym in dynamic.iter_symbols():
        binding = binds.get(sym["st_info"]["bind"])
        if binding is None or not sym.name:
            continue
        target = undefined if sym["st_shndx"] == "SHN_UNDEF" else defined
        target.append(Symbol(sym.name, binding))
    return tuple(undefined), tuple(defined)


def _section_bytes(stream: BinaryIO, section: _Shdr) -> bytes:
    """Read one section's bytes; ElfFormatError when the file holds fewer bytes than declared."""
    stream.seek(section.offset)
    data = stream.read(section.size)
    if len(data) != section.size:
        raise ElfFormatError(f"truncated ELF: section needs {section.size} bytes, file has {len(data)}")
    return data
