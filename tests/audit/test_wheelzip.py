"""Wheels are read from the zip; unsafe archives are refused with exit code 2."""

from __future__ import annotations

import stat
import zipfile
from pathlib import Path

import pytest

from keel.audit import AuditInputError, audit, wheelzip
from keel.audit.cli import main

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


def test_large_member_goes_to_private_temp(
    libs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wheelzip, "IN_MEMORY", 16)
    wheel = make_wheel(tmp_path / "w.whl", {"pkg/_C.abi3.so": libs["stable"]})
    assert audit([wheel]).verdict == "STABLE"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.whl"]
