"""The damage the mutation harness does: one function per kind, (layout, rng) -> mutated bytes; and
zip-level damage to a one-member wheel, (wheel bytes, rng) -> bytes. Each picks its target and
value from the seeded rng, so a seed reproduces a case."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable

from elf_layout import DT, EHDR, PHDR, SHDR, SHT_GNU_HASH, SHT_VERDEF, SHT_VERNEED, SHT_VERSYM, Layout, put


def smashed(rng: random.Random, old: int, size: int, file_size: int) -> int:
    """A hostile value for a field of `size` bytes: zero, one, all ones, around the old value or the
    file size, or random."""
    top = (1 << (8 * size)) - 1
    return rng.choice(
        [0, 1, top, top >> 1, old + 1, old - 1, old * 2 + 7, file_size, file_size + 1, rng.randint(0, top)]
    )


def truncate_random(lay: Layout, rng: random.Random) -> bytes:
    return lay.data[: rng.randrange(0, len(lay.data))]


def truncate_structural(lay: Layout, rng: random.Random) -> bytes:
    """Cut inside a structure the readers need: the ELF header, a header table, a dynamic table."""
    cuts = [4, 17, 40, 63]
    cuts += (
        [o + n // 2 for o, n in lay.regions()] + [o + n - 1 for o, n in lay.regions()] + [o for o, _ in lay.regions()]
    )
    cuts += [p.offset + p.filesz - 1 for p in lay.segments if p.type == 1]
    return lay.data[: max(0, min(rng.choice(cuts), len(lay.data) - 1))]


def flip_random(lay: Layout, rng: random.Random) -> bytes:
    buf = bytearray(lay.data)
    for _ in range(rng.randint(1, 32)):
        buf[rng.randrange(len(buf))] ^= rng.randint(1, 255)
    return bytes(buf)


def flip_structural(lay: Layout, rng: random.Random) -> bytes:
    """Flip 1-8 bytes inside the headers and dynamic tables (where a random flip rarely lands)."""
    buf = bytearray(lay.data)
    regions = lay.regions()
    for _ in range(rng.randint(1, 8)):
        offset, size = rng.choice(regions)
        buf[offset + rng.randrange(size)] ^= rng.randint(1, 255)
    return bytes(buf)


def header_field(lay: Layout, rng: random.Random) -> bytes:
    """e_shoff, e_shnum, e_phoff, e_phnum, e_shstrndx, the entry sizes, e_type/e_machine, class, endianness."""
    buf = bytearray(lay.data)
    field = rng.choice(sorted(EHDR) + ["EI_CLASS", "EI_DATA"])
    if field in ("EI_CLASS", "EI_DATA"):
        buf[4 if field == "EI_CLASS" else 5] = rng.choice([0, 1, 2, 3, 0xFF])
        return bytes(buf)
    at, fmt = lay.fmt(EHDR, field)
    put(buf, at, lay.endian, fmt, smashed(rng, lay.header[field], struct.calcsize(fmt), len(buf)))
    return bytes(buf)


def section_field(lay: Layout, rng: random.Random) -> bytes:
    """sh_offset, sh_size, sh_link, sh_info, sh_entsize or sh_type of a section the readers use."""
    buf = bytearray(lay.data)
    wanted = [s for s in lay.sections if s.name.startswith((".dyn", ".gnu.", ".hash", ".shstrtab"))] or list(
        lay.sections
    )
    if not wanted:
        return truncate_structural(lay, rng)
    sec = rng.choice(wanted)
    field = rng.choice(["sh_offset", "sh_size", "sh_link", "sh_info", "sh_entsize", "sh_type"])
    at, fmt = lay.fmt(SHDR, field)
    old = struct.unpack_from(lay.endian + fmt, buf, sec.header_at + at)[0]
    put(buf, sec.header_at + at, lay.endian, fmt, smashed(rng, old, struct.calcsize(fmt), len(buf)))
    return bytes(buf)


def segment_field(lay: Layout, rng: random.Random) -> bytes:
    """p_offset, p_vaddr, p_filesz or p_type of PT_DYNAMIC or a PT_LOAD (the dynamic-segment reader's map)."""
    buf = bytearray(lay.data)
    wanted = [p for p in lay.segments if p.type in (1, 2)]
    if not wanted:
        return truncate_structural(lay, rng)
    seg = rng.choice(wanted)
    field = rng.choice(["p_offset", "p_vaddr", "p_filesz", "p_type"])
    at, fmt = lay.fmt(PHDR, field)
    old = struct.unpack_from(lay.endian + fmt, buf, seg.header_at + at)[0]
    put(buf, seg.header_at + at, lay.endian, fmt, smashed(rng, old, struct.calcsize(fmt), len(buf)))
    return bytes(buf)


def dynamic_entry(lay: Layout, rng: random.Random) -> bytes:
    """d_val of DT_NEEDED/DT_STRTAB/DT_SYMTAB/DT_STRSZ/DT_SONAME/DT_RUNPATH/DT_VERNEED/..., or a
    d_tag changed, or the DT_NULL terminator removed."""
    buf = bytearray(lay.data)
    entries = [e for e in lay.dynamic() if e[1] in DT.values()]
    if not entries:
        return truncate_structural(lay, rng)
    word = "Q" if lay.is64 else "I"
    half = 8 if lay.is64 else 4
    how = rng.choice(["value", "value", "value", "tag", "no-null"])
    if how == "no-null":
        for pos, tag, _ in lay.dynamic():
            if tag == 0:
                put(buf, pos, lay.endian, word, 21)  # DT_DEBUG
        return bytes(buf)
    pos, tag, val = rng.choice([e for e in entries if e[1] != 0] or entries)
    if how == "tag":
        put(buf, pos, lay.endian, word, rng.choice(sorted(DT.values())))
    else:
        put(buf, pos + half, lay.endian, word, smashed(rng, val, half, len(buf)))
    return bytes(buf)


def dynsym_entry(lay: Layout, rng: random.Random) -> bytes:
    """st_name, st_info, st_other or st_shndx of a few .dynsym entries."""
    buf = bytearray(lay.data)
    sec = lay.section(".dynsym")
    ent = 24 if lay.is64 else 16
    if sec is None or sec.size < 2 * ent:
        return flip_structural(lay, rng)
    fields = {"st_name": (0, "I"), "st_info": (4 if lay.is64 else 12, "B"), "st_other": (5 if lay.is64 else 13, "B")}
    fields["st_shndx"] = (6 if lay.is64 else 14, "H")
    for _ in range(rng.randint(1, 4)):
        at = sec.offset + ent * rng.randrange(1, sec.size // ent)
        off, fmt = fields[rng.choice(sorted(fields))]
        old = struct.unpack_from(lay.endian + fmt, buf, at + off)[0]
        put(buf, at + off, lay.endian, fmt, smashed(rng, old, struct.calcsize(fmt), len(buf)))
    return bytes(buf)


def string_table(lay: Layout, rng: random.Random) -> bytes:
    """.dynstr without its final NUL, with bytes that are not UTF-8, or with names run together."""
    buf = bytearray(lay.data)
    sec = lay.section(".dynstr")
    if sec is None or sec.size < 2:
        return flip_structural(lay, rng)
    how = rng.choice(["no-final-nul", "not-utf8", "no-nuls"])
    end = sec.offset + sec.size
    if how == "no-final-nul":
        buf[end - 1] = 0x41
    elif how == "not-utf8":
        for _ in range(8):
            buf[sec.offset + rng.randrange(sec.size)] = rng.choice([0x80, 0xC3, 0xFF])
    else:
        start = sec.offset + rng.randrange(sec.size)
        buf[start:end] = bytes(b or 0x5F for b in buf[start:end])
    return bytes(buf)


def version_tables(lay: Layout, rng: random.Random) -> bytes:
    """Fields of .gnu.version_r (vn_cnt, vn_file, vn_aux, vn_next, vna_name, vna_next), of
    .gnu.version_d (vd_cnt, vd_aux, vd_next, vda_name) or .gnu.version indices."""
    buf = bytearray(lay.data)
    choices = [s for s in (lay.by_type(SHT_VERNEED), lay.by_type(SHT_VERDEF), lay.by_type(SHT_VERSYM)) if s]
    if not choices:
        return flip_structural(lay, rng)
    sec = rng.choice(choices)
    if sec.type == SHT_VERSYM:
        for _ in range(rng.randint(1, 16)):
            at = sec.offset + 2 * rng.randrange(max(1, sec.size // 2))
            put(buf, at, lay.endian, "H", rng.choice([0x7FFF, 0x8000, 0xFFFF, rng.randint(2, 64)]))
        return bytes(buf)
    # verneed: vn_version H, vn_cnt H, vn_file I, vn_aux I, vn_next I; vernaux: hash I, flags H, other H, name I, next I
    # verdef: vd_version H, vd_flags H, vd_ndx H, vd_cnt H, vd_hash I, vd_aux I, vd_next I; verdaux: name I, next I
    need = sec.type == SHT_VERNEED
    fields = [(2, "H"), (4, "I"), (8, "I"), (12, "I")] if need else [(4, "H"), (6, "H"), (12, "I"), (16, "I")]
    off, fmt = rng.choice(fields)
    if rng.random() < 0.3 and sec.size >= 32:  # an auxiliary entry instead: its name or next offset
        aux = struct.unpack_from(lay.endian + "I", buf, sec.offset + (8 if need else 12))[0]
        off, fmt = aux + rng.choice([8, 12] if need else [0, 4]), "I"
    at = sec.offset + off
    if at + 4 <= len(buf):
        old = struct.unpack_from(lay.endian + fmt, buf, at)[0]
        put(buf, at, lay.endian, fmt, smashed(rng, old, struct.calcsize(fmt), len(buf)))
    return bytes(buf)


def hash_table(lay: Layout, rng: random.Random) -> bytes:
    """.gnu.hash: nbuckets/symoffset/bloom size smashed, a bucket made huge, or every chain end bit
    cleared (a reader that walks the chains must stop on its own)."""
    buf = bytearray(lay.data)
    sec = lay.by_type(SHT_GNU_HASH)
    if sec is None or sec.size < 16:
        return dynamic_entry(lay, rng)
    nbuckets, symoffset, bloom, _ = struct.unpack_from(lay.endian + "4I", buf, sec.offset)
    word = 8 if lay.is64 else 4
    buckets_at = sec.offset + 16 + bloom * word
    how = rng.choice(["header", "bucket", "chains"])
    if how == "header":
        at = sec.offset + 4 * rng.randrange(3)
        put(buf, at, lay.endian, "I", smashed(rng, nbuckets, 4, len(buf)))
    elif how == "bucket" and nbuckets:
        put(buf, buckets_at + 4 * rng.randrange(nbuckets), lay.endian, "I", rng.choice([0xFFFFFFFF, symoffset - 1]))
    else:
        for at in range(buckets_at + 4 * nbuckets, sec.offset + sec.size - 3, 4):
            buf[at if lay.endian == "<" else at + 3] &= 0xFE
    return bytes(buf)


MUTATIONS: dict[str, Callable[[Layout, random.Random], bytes]] = {
    "truncate-random": truncate_random,
    "truncate-structural": truncate_structural,
    "flip-random": flip_random,
    "flip-structural": flip_structural,
    "header-field": header_field,
    "section-field": section_field,
    "segment-field": segment_field,
    "dynamic-entry": dynamic_entry,
    "dynsym-entry": dynsym_entry,
    "string-table": string_table,
    "version-tables": version_tables,
    "hash-table": hash_table,
}


def _first_member(wheel: bytes) -> tuple[int, int]:
    """(offset, size) of the first member's compressed data (the harness writes the ELF member first)."""
    name_len, extra_len = struct.unpack_from("<HH", wheel, 26)
    return 30 + name_len + extra_len, struct.unpack_from("<I", wheel, 18)[0]


def zip_flip_member(wheel: bytes, rng: random.Random) -> bytes:
    """Flip bytes of the ELF member's deflated data (zlib errors, CRC mismatches, wrong lengths)."""
    buf = bytearray(wheel)
    start, size = _first_member(wheel)
    for _ in range(rng.randint(1, 8)):
        buf[start + rng.randrange(max(1, size))] ^= rng.randint(1, 255)
    return bytes(buf)


def zip_truncate(wheel: bytes, rng: random.Random) -> bytes:
    """The archive cut short: no central directory, or one that points past the end."""
    return wheel[: rng.randrange(len(wheel) // 2, len(wheel))]


def zip_directory(wheel: bytes, rng: random.Random) -> bytes:
    """The member's CRC, compressed or uncompressed size smashed in the central directory."""
    buf = bytearray(wheel)
    cd = wheel.find(b"PK\x01\x02")
    if cd < 0:
        return zip_truncate(wheel, rng)
    at = cd + rng.choice([16, 20, 24])
    old = struct.unpack_from("<I", buf, at)[0]
    put(buf, at, "<", "I", smashed(rng, old, 4, len(buf)))
    return bytes(buf)


ZIP_MUTATIONS: dict[str, Callable[[bytes, random.Random], bytes]] = {
    "zip-flip-member": zip_flip_member,
    "zip-truncate": zip_truncate,
    "zip-directory": zip_directory,
}
