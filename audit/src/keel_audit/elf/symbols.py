"""Bulk decoding of .dynamic, .dynsym/.dynstr/.gnu.version and the version tables (.gnu.version_r,
.gnu.version_d): arrays and byte strides, no per-symbol objects. Every reader of the package uses
these on the bytes it found, so all of them decode alike."""

from __future__ import annotations

import array
import operator
import struct
import sys
from itertools import accumulate, compress

from ..errors import ElfFormatError
from .types import MAX_DYNAMIC_TAGS, DynamicSymbols, DynamicTags

_NATIVE = "<" if sys.byteorder == "little" else ">"
_BIND_OK = bytes((i >> 4) if (i >> 4) in (1, 2, 10) else 0 for i in range(256))  # global/weak/unique
_NONZERO = bytes([0]) + bytes([1]) * 255
_VISIBLE = bytes(1 if (o & 0x3) in (0, 3) else 0 for o in range(256))  # default or protected
_U32 = "I" if array.array("I").itemsize == 4 else "L"


def _and(*masks: bytes) -> bytes:
    """Byte-wise AND of equally long 0/1 masks, in C (through big integers)."""
    acc = int.from_bytes(masks[0], "little")
    for mask in masks[1:]:
        acc &= int.from_bytes(mask, "little")
    return acc.to_bytes(len(masks[0]), "little")


def _array(code: str, raw: bytes, endian: str) -> array.array[int]:
    out = array.array(code)
    out.frombytes(raw[: len(raw) // out.itemsize * out.itemsize])
    if endian != _NATIVE:
        out.byteswap()
    return out


def dynsym_names(raw: bytes, strtab: bytes, versym: bytes, endian: str, is64: bool) -> DynamicSymbols:
    """(undefined names, exported names, their binding/version extras) of a .dynsym section.

    Skips unnamed symbols and bindings other than global/weak/unique; exported means a defined
    symbol of default or protected visibility.
    """
    # Elf64_Sym: name u32, info u8, other u8, shndx u16, value, size; Elf32_Sym: name, value, size, ...
    ent, name_step, info_at, shndx_at = (24, 6, 4, 3) if is64 else (16, 4, 12, 7)
    n_syms = len(raw) // ent
    raw = raw[: n_syms * ent]
    name_off = _array(_U32, raw, endian)[::name_step]
    binds = raw[info_at::ent].translate(_BIND_OK)
    visible = raw[info_at + 1 :: ent].translate(_VISIBLE)
    shndx = _array("H", raw, endian)[shndx_at :: ent // 2]
    vers = _array("H", versym, endian)[:n_syms]
    vers.extend([0] * (n_syms - len(vers)))
    if not strtab.endswith(b"\0"):
        raise ElfFormatError("malformed ELF: .dynstr does not end with a NUL byte")
    n_ok = bytes(map(bool, name_off))
    keep = _and(binds.translate(_NONZERO), n_ok)  # 1 per named global/weak/unique symbol
    if any(keep) and max(compress(name_off, keep)) >= len(strtab):
        raise ElfFormatError("malformed ELF: a symbol name starts past the end of .dynstr")
    undefined = _and(keep, bytes(map(operator.not_, shndx)))
    defined = _and(keep, bytes(map(bool, shndx)), visible)
    # latin-1 keeps byte offsets; names are re-decoded as UTF-8 only when not ASCII
    text = strtab.decode("latin-1")
    parts = text.split("\0")
    at = dict(zip(accumulate(map((1).__add__, map(len, parts)), initial=0), parts, strict=False)).get

    def names(select: bytes) -> tuple[str, ...]:
        offs = list(compress(name_off, select))
        found = list(map(at, offs))
        if None in found:  # a name that starts inside another one (tail merging)
            got = [g if g is not None else text[n : text.find("\0", n)] for g, n in zip(found, offs, strict=True)]
        else:
            got = found  # type: ignore[assignment]  # no None left: list[str]
        if not strtab.isascii():
            got = [g.encode("latin-1").decode("utf-8", "replace") for g in got]
        return tuple(got)

    every = (binds, vers.tobytes())  # Symbol objects are built from these only on demand
    return names(undefined), names(defined), (undefined, *every), (defined, *every)


def cstr(table: bytes, offset: int) -> str:
    """NUL-terminated string at `offset`, decoded as pyelftools does (UTF-8, replace); an offset
    outside the table or a string that runs off its end is malformed, never read past it."""
    end = table.find(b"\0", offset) if 0 <= offset < len(table) else -1
    if end < 0:
        raise ElfFormatError(
            f"malformed ELF: a string at offset {offset} is not NUL-terminated inside its "
            f"{len(table)}-byte string table"
        )
    return table[offset:end].decode("utf-8", "replace")


def dynamic_tags(raw: bytes, strtab: bytes, e: str, is64: bool) -> DynamicTags:
    """(soname, needed, rpath, runpath) from the .dynamic entries up to DT_NULL; ElfFormatError when more than
    MAX_DYNAMIC_TAGS come before it."""
    soname: str | None = None
    needed: list[str] = []
    rpath: list[str] = []
    runpath: list[str] = []
    ent = 16 if is64 else 8
    check_dynamic_count(raw, e, is64)
    for tag, val in struct.iter_unpack(e + ("qQ" if is64 else "iI"), raw[: len(raw) // ent * ent]):
        if tag == 0:
            break
        if tag == 1:  # DT_NEEDED
            needed.append(cstr(strtab, val))
        elif tag == 15:  # DT_RPATH
            rpath.extend(p for p in cstr(strtab, val).split(":") if p)
        elif tag == 29:  # DT_RUNPATH
            runpath.extend(p for p in cstr(strtab, val).split(":") if p)
        elif tag == 14:  # DT_SONAME
            soname = cstr(strtab, val)
    return soname, tuple(needed), tuple(rpath), tuple(runpath)


def check_dynamic_count(raw: bytes, e: str, is64: bool) -> None:
    """ElfFormatError when `raw` holds more than MAX_DYNAMIC_TAGS dynamic entries before its DT_NULL."""
    ent = 16 if is64 else 8
    if len(raw) // ent <= MAX_DYNAMIC_TAGS:
        return
    window = raw[: (MAX_DYNAMIC_TAGS + 1) * ent]
    if not any(tag == 0 for (tag,) in struct.iter_unpack(e + ("q8x" if is64 else "i4x"), window)):
        raise ElfFormatError(
            f"malformed ELF: no DT_NULL among the first {MAX_DYNAMIC_TAGS + 1} dynamic entries; expected at most "
            f"{MAX_DYNAMIC_TAGS} before it"
        )


def walk_versions(
    raw: bytes, table: bytes, need: bool, count: int, e: str, names: dict[int, str], needs: list[tuple[str, str]]
) -> None:
    """Walk `count` verneed (need) or verdef entries of `raw` as pyelftools does, filling names/needs.

    Bounded by the section: a count larger than the entries `raw` can hold, an entry or auxiliary
    outside it, or a `vn_next`/`vna_next` chain that revisits an entry is malformed (ElfFormatError).
    """
    kind = ".gnu.version_r" if need else ".gnu.version_d"
    if count > len(raw) // 16:
        raise ElfFormatError(
            f"malformed ELF: {kind} claims {count} entries; {len(raw)} bytes hold at most {len(raw) // 16}"
        )
    pos = 0  # offsets only grow (unsigned vn_next), so a loop is a zero vn_next, checked below
    for i in range(count):
        if pos + 16 > len(raw):
            raise ElfFormatError(f"malformed ELF: {kind} entry {i} at offset {pos} lies outside the section")
        if need:
            _ver, cnt, vfile, aux, nxt = struct.unpack_from(e + "HHIII", raw, pos)
        else:
            _ver, flags, ndx, cnt, _h, aux, nxt = struct.unpack_from(e + "HHHHIII", raw, pos)
        if cnt <= 0 or cnt > len(raw) // (16 if need else 8):
            raise ElfFormatError(f"malformed ELF: {kind} entry {i} has {cnt} auxiliary entries")
        apos = pos + aux
        if not need:  # only the first auxiliary names a definition
            if apos + 8 > len(raw):
                raise ElfFormatError(f"malformed ELF: {kind} auxiliary at offset {apos} lies outside the section")
            if not flags & 0x1:  # skip VER_FLG_BASE
                names[ndx] = cstr(table, struct.unpack_from(e + "I", raw, apos)[0])
        else:
            file = cstr(table, vfile)
            aux_seen = set()
            for _ in range(cnt):
                if apos in aux_seen or apos + 16 > len(raw):
                    raise ElfFormatError(
                        f"malformed ELF: {kind} auxiliary at offset {apos} loops back or lies outside the section"
                    )
                aux_seen.add(apos)
                _hash, _fl, other, vname, anext = struct.unpack_from(e + "IHHII", raw, apos)
                names[other] = cstr(table, vname)
                needs.append((file, names[other]))
                apos += anext
        if nxt == 0 and i + 1 < count:
            raise ElfFormatError(
                f"malformed ELF: {kind} chain ends after {i + 1} of {count} entries (vn_next 0 loops back)"
            )
        pos += nxt
