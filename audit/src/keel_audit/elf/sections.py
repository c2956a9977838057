"""The bulk reader: section headers, then .dynamic, .dynsym/.dynstr and the version sections read
with struct/array in one go. It covers the common case (a linked object with those sections);
`read_sections` returns None for the rest, which the pyelftools fallback reads."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, NamedTuple

from ..errors import ElfFormatError
from .symbols import dynamic_tags, dynsym_names, walk_versions
from .types import MAX_READ, PHDR_SIZE, SHDR_SIZE, ElfInfo, RandomAccess, machine_name, type_name

SHT_DYNAMIC, SHT_NOBITS, SHT_DYNSYM = 6, 8, 11
SHT_VERDEF, SHT_VERNEED, SHT_VERSYM = 0x6FFFFFFD, 0x6FFFFFFE, 0x6FFFFFFF
# ELF header fields after e_ident (e_type .. e_shstrndx), 64- and 32-bit
EHDR64, EHDR32 = "HHIQQQIHHHHHH", "HHIIIIIHHHHHH"


class Shdr(NamedTuple):
    """The fields of one section header the readers use."""

    number: int  # its index in the section header table
    type: int
    offset: int
    size: int
    link: int
    info: int


def read_sections(src: RandomAccess, head: bytes) -> ElfInfo | None:
    """ElfInfo through the section headers; None when the object lacks .dynamic/.dynsym sections
    (or names no valid section-name table): pyelftools reads those. ElfFormatError when the
    headers point outside the file or link to sections that do not exist."""
    is64, e = head[4] == 2, "<" if head[5] == 1 else ">"
    fields = struct.unpack_from(e + (EHDR64 if is64 else EHDR32), head, 16)
    e_type, e_machine, _v, _entry, phoff, shoff, _fl, _eh, phentsize, phnum, shentsize, shnum, shstrndx = fields
    if e_type != 3:
        raise ElfFormatError(f"not a shared object: expected e_type ET_DYN, got {type_name(e_type)}")
    size = src.size
    check_entry_sizes(is64, phnum, phentsize, shnum, shentsize)
    ph = _table(src, phoff, phnum, phentsize, e + ("IIQQQQQQ" if is64 else "IIIIIIII"), "program headers")
    for p in ph:  # (p_type, p_flags, p_offset, .., p_filesz) or (p_type, p_offset, .., p_filesz)
        offset, filesz = (p[2], p[5]) if is64 else (p[1], p[4])
        if p[0] == 1 and offset + filesz > size:  # PT_LOAD
            raise ElfFormatError(f"truncated ELF: a PT_LOAD segment ends past the file size {size}")
    sh = _table(src, shoff, shnum, shentsize, e + ("IIQQQQIIQQ" if is64 else "IIIIIIIIII"), "section headers")
    secs = [Shdr(i, s[1], s[4], s[5], s[6], s[7]) for i, s in enumerate(sh)]
    for sec in secs:
        if sec.type != SHT_NOBITS and sec.offset + sec.size > size:
            raise ElfFormatError(f"truncated ELF: section {sec.number} ends past the file size {size}")
    by_type = {}
    for sec in reversed(secs):  # the first section of each type wins
        by_type[sec.type] = sec
    dyn, dynsym = by_type.get(SHT_DYNAMIC), by_type.get(SHT_DYNSYM)
    if dyn is None or dynsym is None or (shnum and not shstrndx < shnum and shstrndx != 0xFFFF):
        return None
    if not 0 < dynsym.link < len(secs):
        raise ElfFormatError(f"malformed ELF: .dynsym links to section {dynsym.link}")

    def strings(sec: Shdr) -> bytes:
        if not 0 < sec.link < len(secs):
            raise ElfFormatError(f"malformed ELF: section {sec.number} links to section {sec.link}")
        return section_bytes(src, secs[sec.link])

    tags = dynamic_tags(section_bytes(src, dyn), strings(dyn), e, is64)
    vnames, needs = _versions(src, secs, strings, e)
    versym = section_bytes(src, by_type[SHT_VERSYM]) if SHT_VERSYM in by_type else b""
    syms = dynsym_names(section_bytes(src, dynsym), section_bytes(src, secs[dynsym.link]), versym, e, is64)
    return ElfInfo.assemble(machine_name(e_machine), tags, syms, needs, vnames)


def check_entry_sizes(is64: bool, phnum: int, phentsize: int, shnum: int, shentsize: int) -> None:
    """Program and section headers of the one size the ELF specification gives them; ElfFormatError
    otherwise (65,535 entries of 65,535 bytes would be a 4 GB table)."""
    bits = 64 if is64 else 32
    if phnum and phentsize != PHDR_SIZE[is64]:
        raise ElfFormatError(
            f"malformed ELF: e_phentsize {phentsize}; expected {PHDR_SIZE[is64]} (an ELF{bits} program header)"
        )
    if shnum and shentsize != SHDR_SIZE[is64]:
        raise ElfFormatError(
            f"malformed ELF: e_shentsize {shentsize}; expected {SHDR_SIZE[is64]} (an ELF{bits} section header)"
        )


def _table(src: RandomAccess, offset: int, count: int, entsize: int, fmt: str, what: str) -> list[tuple[Any, ...]]:
    """`count` fixed-size header entries at `offset`; ElfFormatError when they end past the file."""
    if not count:
        return []
    if offset + count * entsize > src.size or entsize < struct.calcsize(fmt):
        raise ElfFormatError(f"truncated ELF: {what} end past the file size {src.size}")
    raw = src.read(offset, count * entsize)
    return [struct.unpack_from(fmt, raw, i * entsize) for i in range(count)]


def section_bytes(src: RandomAccess, sec: Shdr) -> bytes:
    """One section's bytes; ElfFormatError when the file holds fewer bytes than declared or the section
    is larger than any reader reads (MAX_READ)."""
    if sec.size > MAX_READ:
        raise ElfFormatError(
            f"malformed ELF: section {sec.number} (type {sec.type:#x}) claims {sec.size} bytes; "
            f"expected at most {MAX_READ} for a dynamic table"
        )
    data = src.read(sec.offset, sec.size)
    if len(data) != sec.size:
        raise ElfFormatError(f"truncated ELF: section needs {sec.size} bytes, file has {len(data)}")
    return data


def _versions(
    src: RandomAccess, secs: list[Shdr], strings: Callable[[Shdr], bytes], e: str
) -> tuple[dict[int, str], list[tuple[str, str]]]:
    """Version index -> name (verneed, verdef) and every (file, version) needed, in section order."""
    names: dict[int, str] = {}
    needs: list[tuple[str, str]] = []
    for sec in secs:
        if sec.type in (SHT_VERNEED, SHT_VERDEF):
            data = section_bytes(src, sec)
            walk_versions(data, strings(sec), sec.type == SHT_VERNEED, sec.info, e, names, needs)
    return names, needs
