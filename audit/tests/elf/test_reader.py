"""ELF reading: DT_NEEDED, RUNPATH, symbols with binding and versions; bad files raise ElfFormatError."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import pytest
from audit_support import make_wheel
from elftools.elf.elffile import ELFFile

from keel_audit.cli import main
from keel_audit.elf import ElfFormatError, read_elf


def test_needed_runpath_and_versions(libs: dict[str, Path]) -> None:
    info = read_elf(libs["needs_c10"])
    assert "libc10.so" in info.needed and info.machine == "EM_X86_64"
    assert read_elf(libs["build_rpath"]).runpath + read_elf(libs["build_rpath"]).rpath == (
        "/home/build/pytorch/torch/lib",
    )
    vector = read_elf(libs["vector"])
    assert any(v.startswith("GLIBCXX_") for _, v in vector.version_needs)
    assert any(s.version and s.version.startswith(("GLIBCXX_", "CXXABI_")) for s in vector.undefined)


def test_bindings(libs: dict[str, Path]) -> None:
    weak = [s for s in read_elf(libs["weak_c10"]).defined if s.name.startswith("_ZNK3c10")]
    assert weak and weak[0].binding == "weak"
    undefined = {s.name: s.binding for s in read_elf(libs["stable"]).undefined}
    assert undefined["torch_call_dispatcher"] == "global"


def test_bytes_and_path_agree(libs: dict[str, Path]) -> None:
    assert read_elf(libs["mixed"]) == read_elf(libs["mixed"].read_bytes())


@pytest.mark.parametrize("fixture,message", [("notelf", "not an ELF file"), ("truncated", "truncated")])
def test_bad_files(libs: dict[str, Path], fixture: str, message: str) -> None:
    with pytest.raises(ElfFormatError, match=message):
        read_elf(libs[fixture])


def test_empty_file() -> None:
    with pytest.raises(ElfFormatError, match="empty file"):
        read_elf(b"")


def _section(data: bytes, name: str) -> tuple[int, int, int, int]:
    """(header offset, sh_offset, sh_size, sh_info) of a section, located with pyelftools."""
    f = ELFFile(io.BytesIO(data))
    for i, sec in enumerate(f.iter_sections()):
        if sec.name == name:
            return f["e_shoff"] + i * f["e_shentsize"], sec["sh_offset"], sec["sh_size"], sec["sh_info"]
    raise AssertionError(f"no {name}")


def _set_dynamic(out: bytearray, data: bytes, tag: int, value: int) -> None:
    """Set the value of the first .dynamic entry with `tag`."""
    _hdr, off, size, _ = _section(data, ".dynamic")
    pos = next(p for p in range(off, off + size, 16) if struct.unpack_from("<q", out, p)[0] == tag)
    struct.pack_into("<Q", out, pos + 8, value)


def _corrupt(data: bytes, how: str) -> bytes:
    """Both readers see the corruption: section headers (sh_info) and dynamic tags (DT_VERNEEDNUM)."""
    out = bytearray(data)
    hdr, off, _size, info = _section(data, ".gnu.version_r")
    if how == "huge-count":
        struct.pack_into("<I", out, hdr + 44, 0xFFFFFFFF)  # sh_info: the number of verneed entries
        _set_dynamic(out, data, 0x6FFFFFFF, 0xFFFFFFFF)
    elif how == "vn-next-cycle":
        assert info >= 1
        struct.pack_into("<I", out, hdr + 44, max(info, 2))
        _set_dynamic(out, data, 0x6FFFFFFF, max(info, 2))
        struct.pack_into("<I", out, off + 12, 0)  # vn_next of the first entry: back to itself
    elif how == "string-offset":
        _set_dynamic(out, data, 1, 1 << 30)  # DT_NEEDED name past the end of .dynstr
    return bytes(out)


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("huge-count", "claims 4294967295 entries"),
        ("vn-next-cycle", "loops back"),
        ("string-offset", "not NUL-terminated inside"),
    ],
)
def test_corrupt_walks_are_bounded(
    libs: dict[str, Path], tmp_path: Path, how: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = _corrupt(libs["vector"].read_bytes(), how)
    with pytest.raises(ElfFormatError, match=message):
        read_elf(bad)
    wheel = make_wheel(tmp_path / "w.whl", {"pkg/_C.abi3.so": bad})  # streamed: dynamic segment first
    assert main([str(wheel)]) == 2
    assert message in capsys.readouterr().out
