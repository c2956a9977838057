"""Wheels are read from the zip; unsafe archives are refused with exit code 2."""

from __future__ import annotations

import stat
import zipfile
from pathlib import Path

import pytest

from keel_audit import AuditInputError, audit, wheelzip
from keel_audit.cli import main

from .conftest import make_wheel


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


@pytest.mark.parametrize("window", [1 << 20, 64])
def test_large_member_streamed_not_extracted(
    libs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window: int
) -> None:
    wheel = make_wheel(tmp_path / "w.whl", {"pkg/_C.abi3.so": libs["stable"], "pkg/_u.so": libs["weak_c10"]})
    whole = audit([wheel])
    monkeypatch.setattr(wheelzip, "HEAD_WINDOW", window)  # 64: every section costs another pass
    monkeypatch.setattr(wheelzip, "CHUNK", 1000)
    assert audit([wheel]) == whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.whl"]


def test_streamed_member_crc_checked(libs: dict[str, Path], tmp_path: Path) -> None:
    data = bytearray(libs["stable"].read_bytes())
    data[len(data) // 2] ^= 0xFF  # flipped after zipping below: the stored CRC no longer matches
    wheel = _zip(tmp_path / "w.whl", [("pkg/_C.abi3.so", libs["stable"].read_bytes())])
    raw = wheel.read_bytes()
    at = raw.index(libs["stable"].read_bytes())
    wheel.write_bytes(raw[:at] + bytes(data) + raw[at + len(data) :])
    with pytest.raises(AuditInputError, match="cannot be read"):
        audit([wheel])
