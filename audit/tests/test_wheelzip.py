"""Wheels are read from the zip; unsafe archives are refused with exit code 2."""

from __future__ import annotations

import builtins
import io
import os
import stat
import tempfile
import zipfile
import zlib
from pathlib import Path

import pytest
from audit_support import make_wheel

from keel_audit import AuditInputError, audit, wheelzip
from keel_audit.cli import main


def _zip(path: Path, entries: list[tuple[zipfile.ZipInfo | str, bytes]]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for info, data in entries:
            zf.writestr(info, data)
    return path


@pytest.mark.parametrize("name", ["../evil.so", "/abs/evil.so", "pkg/../../evil.so", "pkg\\..\\evil.so"])
def test_zip_slip_refused(tmp_path: Path, name: str) -> None:
    wheel = _zip(tmp_path / "bad.whl", [(name, b"x")])
    with pytest.raises(AuditInputError, match="unsafe zip entry name"):
        audit([wheel])
    assert not (tmp_path.parent / "evil.so").exists()


def test_symlink_refused(tmp_path: Path) -> None:
    info = zipfile.ZipInfo("pkg/link.so")
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    wheel = _zip(tmp_path / "bad.whl", [(info, b"/etc/passwd")])
    with pytest.raises(AuditInputError, match="symlink"):
        audit([wheel])


def test_duplicate_refused(tmp_path: Path) -> None:
    with pytest.warns(UserWarning):
        wheel = _zip(tmp_path / "bad.whl", [("pkg/a.so", b"1"), ("pkg/a.so", b"2")])
    with pytest.raises(AuditInputError, match="duplicate"):
        audit([wheel])


def test_absurd_size_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = _zip(tmp_path / "big.whl", [("pkg/a.so", b"\0" * 4096)])
    monkeypatch.setattr(wheelzip, "MAX_MEMBER", 1024)
    with pytest.raises(AuditInputError, match="claims 4096 bytes"):
        audit([wheel])


def test_not_a_zip(tmp_path: Path) -> None:
    bad = tmp_path / "x-1.0-py3-none-any.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(AuditInputError, match="not a zip archive"):
        audit([bad])


def test_missing_input_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "nope.whl")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["no-such-distribution-xyz"]) == 2


def _watch_writes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every file the process opens for writing (builtins/io/os open, tempfile), still opening it."""
    writes: list[str] = []
    real_open, real_os_open = builtins.open, os.open

    def watched_open(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+"):
            writes.append(f"open({file!r}, {mode!r})")
        return real_open(file, mode, *args, **kwargs)

    def watched_os_open(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC):
            writes.append(f"os.open({path!r}, {flags:#o})")
        return real_os_open(path, flags, *args, **kwargs)

    def refused(name: str):
        def call(*args, **kwargs):
            writes.append(f"tempfile.{name}")
            raise AssertionError(f"audit created a temporary file through tempfile.{name}")

        return call

    monkeypatch.setattr(builtins, "open", watched_open)
    monkeypatch.setattr(io, "open", watched_open)
    monkeypatch.setattr(os, "open", watched_os_open)
    for name in (
        "mkstemp",
        "mkdtemp",
        "NamedTemporaryFile",
        "TemporaryFile",
        "SpooledTemporaryFile",
        "TemporaryDirectory",
    ):
        monkeypatch.setattr(tempfile, name, refused(name))
    return writes


@pytest.mark.parametrize("window", [1 << 20, 64])
def test_large_member_streamed_not_extracted(
    libs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window: int
) -> None:
    wheel = make_wheel(tmp_path / "w.whl", {"pkg/_C.abi3.so": libs["stable"], "pkg/_u.so": libs["weak_c10"]})
    whole = audit([wheel])
    monkeypatch.setattr(wheelzip, "HEAD_WINDOW", window)  # 64: every section costs another pass
    monkeypatch.setattr(wheelzip, "CHUNK", 1000)
    writes = _watch_writes(monkeypatch)
    assert audit([wheel]) == whole
    assert writes == [], "the audit opened files for writing"


def test_isal_and_zlib_inflate_alike(libs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # ISA-L is optional: the zlib fallback must give the same audit, wheel members read by threads
    wheel = make_wheel(
        tmp_path / "w.whl", {f"pkg/_{i}.abi3.so": libs[k] for i, k in enumerate(("stable", "mixed", "vector"))}
    )
    first = audit([wheel])
    monkeypatch.setattr(wheelzip, "_inflate_lib", zlib)
    monkeypatch.setattr(wheelzip, "CHUNK", 1000)
    assert audit([wheel]) == first and len(first.libraries) == 3


def test_write_watch_sees_an_extraction(libs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the watch itself: extracting a member (what the audit must never do) is seen
    wheel = make_wheel(tmp_path / "w.whl", {"pkg/_C.abi3.so": libs["stable"]})
    writes = _watch_writes(monkeypatch)
    zipfile.ZipFile(wheel).extract("pkg/_C.abi3.so", tmp_path / "out")
    assert writes and "_C.abi3.so" in writes[0]


def test_streamed_member_crc_checked(libs: dict[str, Path], tmp_path: Path) -> None:
    data = bytearray(libs["stable"].read_bytes())
    data[len(data) // 2] ^= 0xFF  # flipped after zipping below: the stored CRC no longer matches
    wheel = _zip(tmp_path / "w.whl", [("pkg/_C.abi3.so", libs["stable"].read_bytes())])
    raw = wheel.read_bytes()
    at = raw.index(libs["stable"].read_bytes())
    wheel.write_bytes(raw[:at] + bytes(data) + raw[at + len(data) :])
    with pytest.raises(AuditInputError, match="cannot be read"):
        audit([wheel])
