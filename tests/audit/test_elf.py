"""ELF reading: DT_NEEDED, RUNPATH, symbols with binding and versions; bad files raise ElfFormatError."""

from __future__ import annotations

from pathlib import Path

import pytest

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
