"""Bulk decoding of .dynsym/.dynstr/.gnu.version: arrays and byte strides, no per-symbol objects."""

from __future__ import annotations

import array
import sys
from itertools import accumulate, count

from .elf import ElfFormatError, SymbolExtra

_NATIVE = "<" if sys.byteorder == "little" else ">"
_BIND_OK = bytes((i >> 4) if (i >> 4) in (1, 2, 10) else 0 for i in range(256))  # global/weak/unique
_VISIBLE = bytes(1 if (o & 0x3) in (0, 3) else 0 for o in range(256))  # default or protected
_U32 = "I" if array.array("I").itemsize == 4 else "L"


def _array(code: str, raw: bytes, endian: str) -> array.array:
    out = array.array(code)
    out.frombytes(raw[: len(raw) // out.itemsize * out.itemsize])
    if endian != _NATIVE:
        out.byteswap()
    return out


def dynsym_names(
    raw: bytes, strtab: bytes, versym: bytes, endian: str, is64: bool
) -> tuple[tuple[str, ...], tuple[str, ...], SymbolExtra, SymbolExtra]:
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
    keep = [i for i, n, b in zip(count(), name_off, binds) if n and b]
    if keep and max(map(name_off.__getitem__, keep)) >= len(strtab):
        raise ElfFormatError("malformed ELF: a symbol name starts past the end of .dynstr")
    undefined = [i for i in keep if not shndx[i]]
    defined = [i for i in keep if shndx[i] and visible[i]]
    # latin-1 keeps byte offsets; names are re-decoded as UTF-8 only when not ASCII
    text = strtab.decode("latin-1")
    parts = text.split("\0")
    at = dict(zip(accumulate(map((1).__add__, map(len, parts)), initial=0), parts)).get

    def names(idx: list[int]) -> tuple[str, ...]:
        offs = list(map(name_off.__getitem__, idx))
        got = list(map(at, offs))
        if None in got:  # a name that starts inside another one (tail merging)
            got = [g if g is not None else text[n : text.find("\0", n)] for g, n in zip(got, offs)]
        if not strtab.isascii():
            got = [g.encode("latin-1").decode("utf-8", "replace") for g in got]
        return tuple(got)  # type: ignore[arg-type]

    def extra(idx: list[int]) -> SymbolExtra:
        return bytes(map(binds.__getitem__, idx)), tuple(map(vers.__getitem__, idx))

    return names(undefined), names(defined), extra(undefined), extra(defined)
