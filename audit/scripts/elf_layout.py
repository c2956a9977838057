"""Where the structures of an ELF file lie, read with struct alone (not with keel_audit's readers, which
the mutation harness tests): header fields, program and section headers, the dynamic entries."""

from __future__ import annotations

import struct
from dataclasses import dataclass

# field -> (offset, format) in the 64-bit and the 32-bit ELF header
EHDR = {
    "e_type": ((16, "H"), (16, "H")),
    "e_machine": ((18, "H"), (18, "H")),
    "e_phoff": ((32, "Q"), (28, "I")),
    "e_shoff": ((40, "Q"), (32, "I")),
    "e_phentsize": ((54, "H"), (42, "H")),
    "e_phnum": ((56, "H"), (44, "H")),
    "e_shentsize": ((58, "H"), (46, "H")),
    "e_shnum": ((60, "H"), (48, "H")),
    "e_shstrndx": ((62, "H"), (50, "H")),
}
SHDR = {
    "sh_name": ((0, "I"), (0, "I")),
    "sh_type": ((4, "I"), (4, "I")),
    "sh_offset": ((24, "Q"), (16, "I")),
    "sh_size": ((32, "Q"), (20, "I")),
    "sh_link": ((40, "I"), (24, "I")),
    "sh_info": ((44, "I"), (28, "I")),
    "sh_entsize": ((56, "Q"), (36, "I")),
}
PHDR = {
    "p_type": ((0, "I"), (0, "I")),
    "p_offset": ((8, "Q"), (4, "I")),
    "p_vaddr": ((16, "Q"), (8, "I")),
    "p_filesz": ((32, "Q"), (16, "I")),
}
DT = {
    "DT_NULL": 0,
    "DT_NEEDED": 1,
    "DT_HASH": 4,
    "DT_STRTAB": 5,
    "DT_SYMTAB": 6,
    "DT_STRSZ": 10,
    "DT_SYMENT": 11,
    "DT_SONAME": 14,
    "DT_RPATH": 15,
    "DT_RUNPATH": 29,
    "DT_GNU_HASH": 0x6FFFFEF5,
    "DT_VERSYM": 0x6FFFFFF0,
    "DT_VERDEF": 0x6FFFFFFC,
    "DT_VERDEFNUM": 0x6FFFFFFD,
    "DT_VERNEED": 0x6FFFFFFE,
    "DT_VERNEEDNUM": 0x6FFFFFFF,
}
SHT_DYNSYM, SHT_DYNAMIC, SHT_GNU_HASH = 11, 6, 0x6FFFFFF6
SHT_VERDEF, SHT_VERNEED, SHT_VERSYM = 0x6FFFFFFD, 0x6FFFFFFE, 0x6FFFFFFF


@dataclass(frozen=True)
class Section:
    """One section header: its fields and where the header entry itself lies."""

    index: int
    name: str
    type: int
    offset: int
    size: int
    link: int
    entsize: int
    header_at: int


@dataclass(frozen=True)
class Segment:
    """One program header: its fields and where the header entry itself lies."""

    type: int
    offset: int
    vaddr: int
    filesz: int
    header_at: int


@dataclass(frozen=True)
class Layout:
    """An ELF file's bytes and where its structures are (what a damaged header hides is left out)."""

    data: bytes
    is64: bool
    endian: str
    header: dict[str, int]
    sections: tuple[Section, ...]
    segments: tuple[Segment, ...]

    @classmethod
    def parse(cls, data: bytes) -> Layout:
        is64, endian = data[4] == 2, "<" if data[5] == 1 else ">"
        k = 0 if is64 else 1
        header = {f: struct.unpack_from(endian + spec[k][1], data, spec[k][0])[0] for f, spec in EHDR.items()}
        segments = []
        for i in range(header["e_phnum"]):
            at = header["e_phoff"] + i * header["e_phentsize"]
            if at + (56 if is64 else 32) > len(data):
                break
            p = {f: struct.unpack_from(endian + s[k][1], data, at + s[k][0])[0] for f, s in PHDR.items()}
            segments.append(Segment(p["p_type"], p["p_offset"], p["p_vaddr"], p["p_filesz"], at))
        raw = []
        for i in range(header["e_shnum"]):
            at = header["e_shoff"] + i * header["e_shentsize"]
            if at + (64 if is64 else 40) > len(data):
                break
            raw.append(({f: struct.unpack_from(endian + s[k][1], data, at + s[k][0])[0] for f, s in SHDR.items()}, at))
        names = raw[header["e_shstrndx"]][0] if header["e_shstrndx"] < len(raw) else None
        sections = []
        for i, (s, at) in enumerate(raw):
            name = ""
            if names is not None:
                start = names["sh_offset"] + s["sh_name"]
                end = data.find(b"\0", start, names["sh_offset"] + names["sh_size"])
                name = data[start:end].decode("latin-1") if 0 <= start < end else ""
            sections.append(
                Section(i, name, s["sh_type"], s["sh_offset"], s["sh_size"], s["sh_link"], s["sh_entsize"], at)
            )
        return cls(data, is64, endian, header, tuple(sections), tuple(segments))

    def fmt(self, table: dict[str, tuple[tuple[int, str], tuple[int, str]]], field: str) -> tuple[int, str]:
        """(offset inside its structure, struct format) of a field for this ELF class."""
        return table[field][0 if self.is64 else 1]

    def section(self, *names: str) -> Section | None:
        """The first section with one of these names."""
        return next((s for s in self.sections if s.name in names), None)

    def by_type(self, sh_type: int) -> Section | None:
        return next((s for s in self.sections if s.type == sh_type), None)

    def dynamic(self) -> list[tuple[int, int, int]]:
        """(file offset of the entry, d_tag, d_val) of every entry of .dynamic (or PT_DYNAMIC)."""
        sec = self.by_type(SHT_DYNAMIC)
        seg = next((p for p in self.segments if p.type == 2), None)
        start, size = (sec.offset, sec.size) if sec else (seg.offset, seg.filesz) if seg else (0, 0)
        ent = 16 if self.is64 else 8
        out = []
        for pos in range(start, min(start + size, len(self.data) - ent + 1), ent):
            tag, val = struct.unpack_from(self.endian + ("qQ" if self.is64 else "iI"), self.data, pos)
            out.append((pos, tag, val))
        return out

    def regions(self) -> list[tuple[int, int]]:
        """(offset, size) of what the audit reads: headers, dynamic tables, symbol and version data."""
        out = [(0, 64 if self.is64 else 52)]
        h = self.header
        out.append((h["e_phoff"], h["e_phnum"] * h["e_phentsize"]))
        out.append((h["e_shoff"], h["e_shnum"] * h["e_shentsize"]))
        wanted = (".dynamic", ".dynsym", ".dynstr", ".gnu.version", ".gnu.version_r", ".gnu.version_d")
        out += [(s.offset, s.size) for s in self.sections if s.name in wanted + (".gnu.hash", ".hash")]
        return [(o, n) for o, n in out if n > 0 and o + n <= len(self.data)]


def put(buf: bytearray, at: int, endian: str, fmt: str, value: int) -> None:
    """Write `value` (wrapped to the field's width) at `at`, if the field fits in the buffer."""
    size = struct.calcsize(fmt)
    if 0 <= at and at + size <= len(buf):
        struct.pack_into(endian + fmt, buf, at, value % (1 << (8 * size)))
