"""ELF reading with pyelftools: DT_NEEDED, RPATH/RUNPATH, dynamic symbols with binding and version."""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection, DynamicSegment
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection

from .errors import AuditError

ELF_MAGIC = b"\x7fELF"
_BINDINGS = {1: "global", 2: "weak", 10: "unique"}


class ElfFormatError(AuditError):
    """A file that should be an ELF shared object is not one, or is truncated/malformed."""


@dataclass(frozen=True, slots=True)
class Symbol:
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


def _read(stream: BinaryIO, size: int) -> ElfInfo:
    head = stream.read(4)
    if head != ELF_MAGIC:
        raise ElfFormatError(f"not an ELF file: expected magic 7f454c46, got {head.hex() or 'empty file'}")
    stream.seek(0)
    try:
        elf = ELFFile(stream)
        _check_bounds(elf, size)
        if elf["e_type"] != "ET_DYN":
            raise ElfFormatError(f"not a shared object: expected e_type ET_DYN, got {elf['e_type']}")
        return _collect(elf, stream)
    except (ELFError, struct.error, ValueError, EOFError, IndexError, KeyError) as exc:
        raise ElfFormatError(f"truncated or malformed ELF: {exc or type(exc).__name__}") from None
    except Exception as exc:  # construct errors from pyelftools have no common public base
        if type(exc).__module__.startswith(("elftools", "construct")):
            raise ElfFormatError(f"truncated or malformed ELF: {exc}") from None
        raise


def _check_bounds(elf: ELFFile, size: int) -> None:
    """Refuse headers, sections and segments that point past the end of the file."""
    hdr = elf.header
    if hdr["e_shnum"] and hdr["e_shoff"] + hdr["e_shnum"] * hdr["e_shentsize"] > size:
        raise ElfFormatError(f"truncated ELF: section headers end past the file size {size}")
    if hdr["e_phoff"] + hdr["e_phnum"] * hdr["e_phentsize"] > size:
        raise ElfFormatError(f"truncated ELF: program headers end past the file size {size}")
    for seg in elf.iter_segments():
        if seg["p_type"] == "PT_LOAD" and seg["p_offset"] + seg["p_filesz"] > size:
            raise ElfFormatError(f"truncated ELF: a PT_LOAD segment ends past the file size {size}")
    for sec in elf.iter_sections():
        if sec["sh_type"] != "SHT_NOBITS" and sec["sh_offset"] + sec["sh_size"] > size:
            raise ElfFormatError(f"truncated ELF: section {sec.name or '?'} ends past the file size {size}")


def _collect(elf: ELFFile, stream: BinaryIO) -> ElfInfo:
    needed: list[str] = []
    rpath: list[str] = []
    runpath: list[str] = []
    soname = None
    dynamic = elf.get_section_by_name(".dynamic")
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
    version_names, needs = _versions(elf)
    undefined, defined = _symbols(elf, stream, version_names, dynamic)
    return ElfInfo(
        machine=elf["e_machine"], soname=soname, needed=tuple(needed),
        rpath=tuple(rpath), runpath=tuple(runpath), undefined=undefined, defined=defined,
        version_needs=tuple(needs),
    )


def _versions(elf: ELFFile) -> tuple[dict[int, str], list[tuple[str, str]]]:
    """Map version index -> name (verneed and verdef), and list every (file, version) needed."""
    names: dict[int, str] = {}
    needs: list[tuple[str, str]] = []
    for sec in elf.iter_sections():
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


def _symbols(elf: ELFFile, stream: BinaryIO, vnames: dict[int, str],
             dynamic: object) -> tuple[tuple[Symbol, ...], tuple[Symbol, ...]]:
    """Undefined and exported dynamic symbols, parsed with struct for speed."""
    dynsym = next((s for s in elf.iter_sections() if s["sh_type"] == "SHT_DYNSYM"), None)
    if dynsym is None:
        return _symbols_from_segment(dynamic)
    is64 = elf.elfclass == 64
    endian = "<" if elf.little_endian else ">"
    fmt = endian + ("IBBHQQ" if is64 else "IIIBBH")
    entsize = struct.calcsize(fmt)
    raw = _section_bytes(stream, dynsym)
    strtab = _section_bytes(stream, elf.get_section(dynsym["sh_link"]))
    versym_sec = next((s for s in elf.iter_sections() if s["sh_type"] == "SHT_GNU_versym"), None)
    versym = _section_bytes(stream, versym_sec) if versym_sec is not None else b""
    count = len(raw) // entsize
    vers = struct.unpack(f"{endian}{len(versym) // 2}H", versym) if versym else ()
    undefined: list[Symbol] = []
    defined: list[Symbol] = []
    for i, ent in enumerate(struct.iter_unpack(fmt, raw[: count * entsize])):
        if is64:
            st_name, st_info, st_other, st_shndx = ent[0], ent[1], ent[2], ent[3]
        else:
            st_name, st_info, st_other, st_shndx = ent[0], ent[3], ent[4], ent[5]
        binding = _BINDINGS.get(st_info >> 4)
        if binding is None or not st_name:
            continue
        end = strtab.find(b"\0", st_name)
        if end < 0:
            raise ElfFormatError("malformed ELF: a symbol name runs past .dynstr")
        name = strtab[st_name:end].decode("utf-8", "replace")
        version = vnames.get(vers[i] & 0x7FFF) if i < len(vers) else None
        if st_shndx == 0:
            undefined.append(Symbol(name, binding, version))
        elif st_other & 0x3 in (0, 3):  # default or protected visibility
            defined.append(Symbol(name, binding, version))
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


def _section_bytes(stream: BinaryIO, section: object) -> bytes:
    """Read one section's bytes; ElfFormatError when the file holds fewer bytes than declared."""
    stream.seek(section["sh_offset"])  # type: ignore[index]
    size = section["sh_size"]  # type: ignore[index]
    data = stream.read(size)
    if len(data) != size:
        raise ElfFormatError(f"truncated ELF: section needs {size} bytes, file has {len(data)}")
    return data
