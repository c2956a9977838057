"""The dynamic-segment reader: program headers and PT_DYNAMIC alone, for streamed wheel members.

A linked object keeps .dynsym/.dynstr/.gnu.version*/.gnu.hash in its first PT_LOAD and .dynamic in
the data segment; only the section header table (and debug info, .symtab, payloads) sit after them.
So a wheel member is inflated only up to the end of what the dynamic segment points at. Every
address is mapped to a file offset through PT_LOAD; anything missing, odd or out of range returns
None and the caller takes the section-header path (which reads the whole member, CRC included).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from ..errors import ElfFormatError
from .sections import EHDR32, EHDR64
from .symbols import dynamic_tags, dynsym_names, walk_versions
from .types import MAX_DYNAMIC_TAGS, MAX_READ, PHDR_SIZE, SHDR_SIZE, ElfInfo, RandomAccess, machine_name

DT_HASH, DT_STRTAB, DT_SYMTAB, DT_STRSZ, DT_SYMENT = 4, 5, 6, 10, 11
DT_GNU_HASH, DT_VERSYM = 0x6FFFFEF5, 0x6FFFFFF0
DT_VERDEF, DT_VERDEFNUM, DT_VERNEED, DT_VERNEEDNUM = 0x6FFFFFFC, 0x6FFFFFFD, 0x6FFFFFFE, 0x6FFFFFFF
_ADDRESS_TAGS = frozenset({DT_HASH, DT_STRTAB, DT_SYMTAB, DT_STRSZ, DT_SYMENT, DT_GNU_HASH, DT_VERSYM})
_ADDRESS_TAGS |= {DT_VERDEF, DT_VERDEFNUM, DT_VERNEED, DT_VERNEEDNUM}
_WIDE_HASH = (22, 0x9026)  # EM_S390, EM_ALPHA: 64-bit DT_HASH entries
VERSION_WINDOW = 1 << 16  # bytes read at a verneed/verdef address (walks past it fall back)
MAX_CHAIN = 1 << 20  # GNU hash chain steps before giving up
CHAIN_BLOCK = 1024  # chain words read at once


class _Unusable(Exception):
    """The dynamic segment does not give a complete, consistent readout."""


def read_dynamic(src: RandomAccess, head: bytes) -> ElfInfo | None:
    """The same ElfInfo as the section-header reader, or None when the dynamic segment is not enough."""
    try:
        return _read(src, head)
    except (_Unusable, ElfFormatError, struct.error, ValueError, IndexError, OverflowError):
        return None


def _read(src: RandomAccess, head: bytes) -> ElfInfo:
    is64, e = head[4] == 2, "<" if head[5] == 1 else ">"
    if len(head) < (64 if is64 else 52):
        raise _Unusable
    fields = struct.unpack_from(e + (EHDR64 if is64 else EHDR32), head, 16)
    e_type, e_machine, _v, _entry, phoff, shoff, _fl, _eh, phentsize, phnum, shentsize, shnum, shstrndx = fields
    size = src.size
    if (
        e_type != 3
        or not phnum
        or phentsize != PHDR_SIZE[is64]
        or phoff + phnum * phentsize > size
        or not shnum  # no section headers: pyelftools reads such objects differently
        or shentsize != SHDR_SIZE[is64]
        or shoff + shnum * shentsize > size
        or not shstrndx < shnum
    ):
        raise _Unusable
    raw = _exact(src, phoff, phnum * phentsize)
    loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
    dynamic = None
    for i in range(phnum):
        ph = struct.unpack_from(e + ("IIQQQQ" if is64 else "IIIIII"), raw, i * phentsize)
        p_type, offset, vaddr, filesz = (ph[0], ph[2], ph[3], ph[5]) if is64 else (ph[0], ph[1], ph[2], ph[4])
        if p_type == 1:  # PT_LOAD
            if offset + filesz > size:
                raise _Unusable
            loads.append((vaddr, offset, filesz))
        elif p_type == 2 and dynamic is None:  # PT_DYNAMIC
            dynamic = (offset, filesz)
    if dynamic is None or not dynamic[1]:
        raise _Unusable
    ent = 16 if is64 else 8
    dyn = _exact(src, dynamic[0], min(dynamic[1], (MAX_DYNAMIC_TAGS + 1) * ent))  # (dynamic_tags checks the count)
    tags: dict[int, int] = {}
    for tag, val in struct.iter_unpack(e + ("qQ" if is64 else "iI"), dyn[: len(dyn) // ent * ent]):
        if tag == 0:
            break
        if tag in _ADDRESS_TAGS:
            if tags.setdefault(tag, val) != val:
                raise _Unusable
    sym_ent = 24 if is64 else 16
    if tags.get(DT_SYMENT) != sym_ent or not {DT_STRTAB, DT_STRSZ, DT_SYMTAB} <= tags.keys():
        raise _Unusable

    def at(addr: int, n: int) -> bytes:
        for vaddr, offset, filesz in loads:
            if vaddr <= addr and addr + n <= vaddr + filesz:
                return _exact(src, offset + addr - vaddr, n)
        raise _Unusable

    strtab = at(tags[DT_STRTAB], tags[DT_STRSZ])
    n_syms = _symbol_count(tags, at, e, 8 if is64 else 4, is64 and e_machine in _WIDE_HASH, loads)
    soname, needed, rpath, runpath = dynamic_tags(dyn, strtab, e, is64)
    names: dict[int, str] = {}
    needs: list[tuple[str, str]] = []
    pairs = ((DT_VERDEF, DT_VERDEFNUM), (DT_VERNEED, DT_VERNEEDNUM))
    walks = [(tags[t], tags.get(n, -1), t == DT_VERNEED) for t, n in pairs if t in tags]
    for addr, count, need in sorted(walks, key=lambda w: _offset(loads, w[0])):  # section order
        if count < 0:
            raise _Unusable
        walk_versions(_window(loads, at, addr), strtab, need, count, e, names, needs)
    versym = at(tags[DT_VERSYM], 2 * n_syms) if DT_VERSYM in tags else b""
    syms = dynsym_names(at(tags[DT_SYMTAB], n_syms * sym_ent), strtab, versym, e, is64)
    return ElfInfo.assemble(machine_name(e_machine), (soname, needed, rpath, runpath), syms, needs, names)


def _exact(src: RandomAccess, offset: int, n: int) -> bytes:
    if not 0 <= n <= MAX_READ:
        raise _Unusable
    data = src.read(offset, n)
    if len(data) != n:
        raise _Unusable
    return data


def _offset(loads: list[tuple[int, int, int]], addr: int) -> int:
    for vaddr, offset, filesz in loads:
        if vaddr <= addr < vaddr + filesz:
            return offset + addr - vaddr
    raise _Unusable


def _window(loads: list[tuple[int, int, int]], at: Callable[[int, int], bytes], addr: int) -> bytes:
    """Up to VERSION_WINDOW bytes at `addr`, cut at the end of its PT_LOAD segment."""
    for vaddr, _off, filesz in loads:
        if vaddr <= addr < vaddr + filesz:
            return at(addr, min(VERSION_WINDOW, vaddr + filesz - addr))
    raise _Unusable


def _symbol_count(
    tags: dict[int, int],
    at: Callable[[int, int], bytes],
    e: str,
    bloom_word: int,
    wide_hash: bool,
    loads: list[tuple[int, int, int]],
) -> int:
    """.dynsym entries: DT_HASH nchain and/or the end of the last DT_GNU_HASH chain (must agree)."""
    counts: set[int] = set()
    if DT_HASH in tags and not wide_hash:
        counts.add(int(struct.unpack(e + "II", at(tags[DT_HASH], 8))[1]))
    if DT_GNU_HASH in tags:
        counts.add(_gnu_count(tags[DT_GNU_HASH], at, e, bloom_word, loads))
    if len(counts) != 1:
        raise _Unusable
    return counts.pop()


def _gnu_count(addr: int, at: Callable[[int, int], bytes], e: str, word: int, loads: list[tuple[int, int, int]]) -> int:
    """Symbol count from a GNU hash table: past the chain end of the highest bucket, or symoffset."""
    nbuckets, symoffset, bloom_words, _shift = struct.unpack(e + "4I", at(addr, 16))
    buckets_at = addr + 16 + bloom_words * word
    buckets = struct.unpack(e + f"{nbuckets}I", at(buckets_at, 4 * nbuckets))
    last = max(buckets, default=0)
    if not last:
        return int(symoffset)
    if last < symoffset:
        raise _Unusable
    chains_at = buckets_at + 4 * nbuckets
    idx = last
    while idx < last + MAX_CHAIN:  # chain words in blocks, each inside its PT_LOAD segment
        start = chains_at + 4 * (idx - symoffset)
        n = min(CHAIN_BLOCK, last + MAX_CHAIN - idx, _left(loads, start) // 4)
        if n <= 0:
            raise _Unusable
        for k, value in enumerate(struct.unpack(f"{e}{n}I", at(start, 4 * n))):
            if value & 1:
                return int(idx + k + 1)
        idx += n
    raise _Unusable


def _left(loads: list[tuple[int, int, int]], addr: int) -> int:
    """Bytes from `addr` to the end of the PT_LOAD segment holding it (0 when none does)."""
    for vaddr, _off, filesz in loads:
        if vaddr <= addr < vaddr + filesz:
            return vaddr + filesz - addr
    return 0
