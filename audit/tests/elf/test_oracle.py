"""The ELF readers (bulk, dynamic-segment, pyelftools fallback) against independent oracles:
binutils' `nm -D` / `readelf -d` and pyelftools' own symbol iteration (no keel_audit decoder)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from audit_support import SOURCES, compile_library, torch_library
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

from keel_audit import elf
from keel_audit.elf.fallback import read_with_pyelftools
from keel_audit.elf.sections import read_sections
from keel_audit.elf.segments import read_dynamic

needs_binutils = pytest.mark.skipif(not (shutil.which("nm") and shutil.which("readelf")), reason="needs binutils")
FIXTURES = sorted(k for k in SOURCES if k not in ("notelf", "truncated"))


def nm_symbols(path: Path) -> tuple[set[str], set[str]]:
    """(undefined, defined-and-visible) dynamic symbol names as `nm -D` prints them (no version suffix)."""
    out = subprocess.run(["nm", "-D", "--format=posix", str(path)], capture_output=True, text=True, check=True)
    undefined, defined = set(), set()
    for line in out.stdout.splitlines():
        name, kind = line.split()[:2]
        name = name.split("@")[0]
        (undefined if kind in ("U", "w", "v") else defined).add(name)
    return undefined, defined


def readelf_needed(path: Path) -> tuple[str, ...]:
    out = subprocess.run(["readelf", "-dW", str(path)], capture_output=True, text=True, check=True).stdout
    return tuple(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out))


def pyelftools_symbols(path: Path) -> tuple[set[str], set[str], tuple[str, ...]]:
    """(undefined, exported, needed) straight from pyelftools' own iteration."""
    with open(path, "rb") as fh:
        f = ELFFile(fh)
        dynsym = f.get_section_by_name(".dynsym")
        undefined, exported = set(), set()
        for sym in dynsym.iter_symbols():
            if not sym.name or sym["st_info"]["bind"] not in ("STB_GLOBAL", "STB_WEAK", "STB_GNU_UNIQUE"):
                continue
            if sym["st_shndx"] == "SHN_UNDEF":
                undefined.add(sym.name)
            elif sym["st_other"]["visibility"] in ("STV_DEFAULT", "STV_PROTECTED"):
                exported.add(sym.name)
        dyn = next(s for s in f.iter_sections() if isinstance(s, DynamicSection))
        needed = tuple(t.needed for t in dyn.iter_tags() if t.entry.d_tag == "DT_NEEDED")
    return undefined, exported, needed


def _readers(path: Path) -> dict[str, elf.ElfInfo | None]:
    data = path.read_bytes()
    src = elf.BytesSource(data)
    return {
        "bulk": read_sections(src, data[:64]),
        "dynamic": read_dynamic(src, data[:64]),
        "pyelftools-fallback": read_with_pyelftools(data),
    }


@needs_binutils
@pytest.mark.parametrize("fixture", FIXTURES)
def test_readers_match_nm_and_readelf(libs: dict[str, Path], fixture: str) -> None:
    path = libs[fixture]
    und, dfn = nm_symbols(path)
    needed = readelf_needed(path)
    for reader, info in _readers(path).items():
        assert info is not None, reader
        assert set(info.undefined_names) == und, (reader, fixture)
        assert set(info.defined_names) <= dfn and info.needed == needed, (reader, fixture)


@pytest.mark.parametrize("fixture", FIXTURES)
def test_readers_match_pyelftools_iteration(libs: dict[str, Path], fixture: str) -> None:
    und, exported, needed = pyelftools_symbols(libs[fixture])
    for reader, info in _readers(libs[fixture]).items():
        assert (set(info.undefined_names), set(info.defined_names), info.needed) == (und, exported, needed), reader


@needs_binutils
@pytest.mark.parametrize("name", ["libc10.so", "libtorch_cpu.so"])
def test_readers_match_nm_on_torch(name: str) -> None:
    path = torch_library(name)
    if path is None:
        pytest.skip(f"no installed torch with {name}")
    und, dfn = nm_symbols(path)
    info = elf.read_elf(path)
    assert set(info.undefined_names) == und
    assert set(info.defined_names) <= dfn and len(info.defined_names) > 0.9 * len(dfn)
    assert info.needed == readelf_needed(path)


def test_pyelftools_fallback_on_object_without_sections(libs: dict[str, Path]) -> None:
    # no section headers: only the pyelftools path (DT_SYMTAB walk) can read it; nm cannot
    data = bytearray(libs["stable"].read_bytes())
    data[60:62] = b"\0\0"  # e_shnum = 0
    info = elf.read_elf(bytes(data))
    und, _exported, needed = pyelftools_symbols(libs["stable"])
    assert set(info.undefined_names) == und and info.needed == needed


def test_pyelftools_fallback_errors_are_format_errors() -> None:
    with pytest.raises(elf.ElfFormatError):
        read_with_pyelftools(b"\x7fELF" + bytes(60))


# two versions of one function (f@VER_1 hidden, f@@VER_2 default), an unversioned-by-default one,
# and an import with a glibc version: what a resolver of undefined symbols needs from both sides
VERSIONED = (
    "int f_old(void) { return 1; }\nint f_new(void) { return 2; }\nint plain(void) { return 3; }\n"
    '__asm__(".symver f_old, f@VER_1");\n__asm__(".symver f_new, f@@VER_2");\n'
    'extern int puts(const char*);\nint use(void) { return puts("x"); }\n'
)
VERSION_SCRIPT = "VER_1 { global: plain; f; local: *; };\nVER_2 { global: f; use; } VER_1;\n"


def nm_versions(path: Path) -> tuple[set[tuple[str, str | None]], set[tuple[str, str | None, bool]]]:
    """(undefined (name, version), defined (name, version, hidden)) as `nm -D --with-symbol-versions`
    prints them: `name@@V` is the default version, `name@V` a hidden one (for definitions)."""
    cmd = ["nm", "-D", "--with-symbol-versions", "--format=posix", str(path)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    undefined, defined = set(), set()
    for line in out.splitlines():
        text, kind = line.split()[:2]
        name, sep, version = text.partition("@@") if "@@" in text else text.partition("@")
        if kind in ("U", "w", "v"):
            undefined.add((name, version or None))
        elif kind != "A":  # not the absolute symbol that names a version definition
            defined.add((name, version or None, sep == "@"))
    return undefined, defined


@needs_binutils
def test_symbol_versions_and_hidden_bit_match_nm(tmp_path: Path) -> None:
    script = tmp_path / "v.map"
    script.write_text(VERSION_SCRIPT)
    path = compile_library(tmp_path / "libv.so", "c", VERSIONED, (f"-Wl,--version-script={script}",))
    und, dfn = nm_versions(path)
    assert ("f", "VER_1", True) in dfn and ("f", "VER_2", False) in dfn, dfn  # the oracle sees both
    data = path.read_bytes()
    for reader, info in _readers(path).items():
        assert info is not None, reader
        assert {(s.name, s.version) for s in info.undefined} == und, reader
        assert {(s.name, s.version, s.hidden) for s in info.defined if s.name not in ("VER_1", "VER_2")} == dfn, reader
    assert elf.read_elf(data) == elf.read_elf(path)
