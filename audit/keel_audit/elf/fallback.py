"""The pyelftools fallback, for the rare objects the bulk reader leaves alone (no .dynamic/.dynsym
sections, an odd ELF class or encoding): slower, and it words the errors of odd headers."""

from __future__ import annotations

import io
import struct

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection, DynamicSegment, DynamicTag
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection

from ..errors import ElfFormatError
from .symbols import dynsym_names
from .types import NO_EXTRA, DynamicSymbols, ElfInfo, SymbolExtra, machine_name

_SHT_DYNSYM, _SHT_VERSYM = 11, 0x6FFFFFFF


def read_with_pyelftools(data: bytes) -> ElfInfo:
    """Parse with pyelftools; every pyelftools/construct failure becomes ElfFormatError."""
    try:
        elf = ELFFile(io.BytesIO(data))
        if elf["e_type"] != "ET_DYN":
            raise ElfFormatError(f"not a shared object: expected e_type ET_DYN, got {elf['e_type']}")
        return _collect(elf, data)
    except (ELFError, struct.error, ValueError, EOFError, IndexError, KeyError, OverflowError) as exc:
        raise ElfFormatError(f"truncated or malformed ELF: {exc or type(exc).__name__}") from None
    except Exception as exc:  # construct errors from pyelftools have no common public base
        if type(exc).__module__.startswith(("elftools", "construct")):
            raise ElfFormatError(f"truncated or malformed ELF: {exc}") from None
        raise


def _collect(elf: ELFFile, data: bytes) -> ElfInfo:
    needed: list[str] = []
    rpath: list[str] = []
    runpath: list[str] = []
    soname = None
    dynamic: DynamicSection | DynamicSegment | None
    dynamic = next((s for s in elf.iter_sections() if isinstance(s, DynamicSection)), None)
    if dynamic is None:
        dynamic = next((s for s in elf.iter_segments() if isinstance(s, DynamicSegment)), None)
    if dynamic is not None:
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
    names: dict[int, str] = {}
    needs: list[tuple[str, str]] = []
    for sec in elf.iter_sections():
        if isinstance(sec, GNUVerNeedSection):
            for verneed, auxes in sec.iter_versions():
                for aux in auxes:
                    names[aux["vna_other"]] = aux.name
                    needs.append((verneed.name or "", aux.name))
        elif isinstance(sec, GNUVerDefSection):
            for verdef, auxes in sec.iter_versions():
                first = next(iter(auxes), None)
                if first is not None and not verdef["vd_flags"] & 0x1:  # skip VER_FLG_BASE
                    names[verdef["vd_ndx"]] = first.name
    tags = (soname, tuple(needed), tuple(rpath), tuple(runpath))
    return ElfInfo.assemble(machine_name(elf["e_machine"]), tags, _symbols(elf, data, dynamic), needs, names)


def _text(tag: DynamicTag, name: str) -> str:
    """The string pyelftools attaches to a DT_NEEDED/DT_RPATH/DT_RUNPATH/DT_SONAME tag."""
    return str(vars(tag)[name])


def _symbols(elf: ELFFile, data: bytes, dynamic: object) -> DynamicSymbols:
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

    def extra(syms: list[tuple[str, int]]) -> SymbolExtra:  # no versions without .gnu.version
        return b"\1" * len(syms), bytes(b for _, b in syms), bytes(2 * len(syms))

    return tuple(n for n, _ in undefined), tuple(n for n, _ in defined), extra(undefined), extra(defined)
