"""The dynamic-segment reader (wheel members) gives exactly the section-header readout, or falls back."""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path

import pytest
from audit_support import SOURCES, SYSTEM_LIB_DIR, compile_library, torch_lib_dir

from keel_audit import AuditInputError, audit, elf, wheelzip
from keel_audit.elf.sections import read_sections
from keel_audit.elf.segments import read_dynamic

SYSTEM = SYSTEM_LIB_DIR
SYSTEM_LIBS = ("libc.so.6", "libm.so.6", "libstdc++.so.6", "libz.so.1", "libgcc_s.so.1", "libpython3.11.so.1.0")


def _both(path: Path) -> tuple[elf.ElfInfo | None, elf.ElfInfo | None]:
    """(dynamic-segment readout, section-header readout) of one file."""
    with open(path, "rb") as fh:
        src = elf.FileSource(fh, path.stat().st_size)
        head = src.read(0, 64)
        return read_dynamic(src, head), read_sections(src, head)


def _torch_libs() -> list[object]:  # paths, or one skipped param
    lib = torch_lib_dir()
    if lib is None:
        return [
            pytest.param(None, id="no-torch", marks=pytest.mark.skip(reason="no torch importable by this interpreter"))
        ]
    return sorted(lib.glob("*.so*"))


def test_fixture_libraries_identical(libs: dict[str, Path]) -> None:
    for name, path in libs.items():
        if name in ("notelf", "truncated"):
            continue
        fast, full = _both(path)
        assert fast is not None, name
        assert fast == full, name


@pytest.mark.parametrize("style", ["sysv", "both", "gnu"])
def test_hash_styles_identical(tmp_path: Path, style: str) -> None:
    lang, source, _ = SOURCES["vector"]
    lib = compile_library(tmp_path / f"h_{style}.so", lang, source, (f"-Wl,--hash-style={style}",))
    fast, full = _both(lib)
    assert fast is not None and fast == full and fast.undefined


@pytest.mark.parametrize("path", _torch_libs(), ids=lambda p: getattr(p, "name", None))
def test_torch_libraries_identical(path: Path) -> None:
    fast, full = _both(path)
    assert fast is not None and fast == full


@pytest.mark.parametrize("name", SYSTEM_LIBS)
def test_system_libraries_identical(name: str) -> None:
    path = SYSTEM / name
    if not path.is_file():
        pytest.skip(f"{path} not present")
    fast, full = _both(path.resolve())
    assert fast is not None and fast == full


def _member(data: bytes, method: int = zipfile.ZIP_DEFLATED) -> wheelzip.MemberReader:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as zf:
        zf.writestr("pkg/_C.so", data)
    zf = zipfile.ZipFile(buf)
    return wheelzip.MemberReader(zf, zf.infolist()[0])


def _padded(lib: Path) -> bytes:
    """The library with 1 MiB of trailing bytes, as a debug-info tail would be."""
    return lib.read_bytes() + bytes(range(256)) * 4096


@pytest.fixture
def small_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wheelzip, "MIN_READ", 512)
    monkeypatch.setattr(wheelzip, "CHUNK", 4096)


@pytest.mark.usefixtures("small_reads")
def test_member_inflated_only_as_far_as_needed(libs: dict[str, Path]) -> None:
    data = _padded(libs["vector"])
    reader = _member(data)
    assert elf.read_elf(reader) == elf.read_elf(libs["vector"])
    assert reader.passes == 1 and reader.pos < len(data) // 10


def _without_dynamic(data: bytes) -> bytes:
    """PT_DYNAMIC turned into PT_NULL: the dynamic-segment reader must give up."""
    phoff, phent, phnum = struct.unpack_from("<Q", data, 32)[0], *struct.unpack_from("<HH", data, 54)
    out = bytearray(data)
    for i in range(phnum):
        if struct.unpack_from("<I", out, phoff + i * phent)[0] == 2:
            struct.pack_into("<I", out, phoff + i * phent, 0)
    return bytes(out)


@pytest.mark.usefixtures("small_reads")
def test_fallback_reads_whole_member_with_crc(libs: dict[str, Path], tmp_path: Path) -> None:
    data = _without_dynamic(_padded(libs["stable"]))
    reader = _member(data)
    assert read_dynamic(reader, reader.read(0, 64)) is None
    info = elf.read_elf(reader)  # section headers: the whole member is inflated
    assert info.undefined_names == elf.read_elf(libs["stable"]).undefined_names and reader.pos == len(data)
    bad = bytearray(data)
    bad[-100] ^= 0xFF  # in the tail, after everything the audit reads
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as zf:  # stored, so the bytes can be flipped in place
        zf.writestr("pkg/_C.abi3.so", data)
    raw = wheel.read_bytes()
    at = raw.index(data)
    wheel.write_bytes(raw[:at] + bytes(bad) + raw[at + len(data) :])
    with pytest.raises(AuditInputError, match="cannot be read"):
        audit([wheel])


def _stored_member(data: bytes, flip: int) -> wheelzip.MemberReader:
    """A stored member whose byte at `flip` was changed after zipping (its CRC no longer matches)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("pkg/_C.so", data)
    raw = bytearray(buf.getvalue())
    raw[raw.index(data) + flip] ^= 0xFF
    zf = zipfile.ZipFile(io.BytesIO(bytes(raw)))
    return wheelzip.MemberReader(zf, zf.infolist()[0])


@pytest.mark.usefixtures("small_reads")
def test_fast_path_skips_tail_crc(libs: dict[str, Path]) -> None:
    """Documented trade-off: a flipped byte past what the audit reads goes unseen (pip checks RECORD)."""
    data = _padded(libs["stable"])
    reader = _stored_member(data, len(data) - 100)
    assert elf.read_elf(reader) == elf.read_elf(libs["stable"]) and reader.pos < len(data)
    fallback = _stored_member(_without_dynamic(data), len(data) - 100)
    with pytest.raises(AuditInputError, match="cannot be read"):
        elf.read_elf(fallback)


@pytest.mark.parametrize("patch", ["no_sections", "no_dynamic", "bad_symtab"])
def test_unusable_dynamic_segment_returns_none(libs: dict[str, Path], patch: str) -> None:
    out = bytearray(libs["stable"].read_bytes())
    if patch == "no_sections":
        struct.pack_into("<H", out, 60, 0)  # e_shnum
    elif patch == "no_dynamic":
        out[:] = _without_dynamic(bytes(out))
    else:
        phoff, phent, phnum = struct.unpack_from("<Q", out, 32)[0], *struct.unpack_from("<HH", out, 54)
        dyn = next(
            (
                struct.unpack_from("<Q", out, phoff + i * phent + 8)[0],
                struct.unpack_from("<Q", out, phoff + i * phent + 32)[0],
            )
            for i in range(phnum)
            if struct.unpack_from("<I", out, phoff + i * phent)[0] == 2
        )
        for pos in range(dyn[0], dyn[0] + dyn[1], 16):
            if struct.unpack_from("<q", out, pos)[0] == 6:  # DT_SYMTAB, pointed nowhere
                struct.pack_into("<Q", out, pos + 8, 1 << 40)
    src = elf.BytesSource(bytes(out))
    assert read_dynamic(src, bytes(out[:64])) is None
