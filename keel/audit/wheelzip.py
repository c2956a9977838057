"""Read a wheel straight from its zip: refuse zip-slip names, symlinks, absurd sizes, duplicates."""

from __future__ import annotations

import shutil
import stat
import zipfile
from pathlib import Path, PurePosixPath

from .errors import AuditInputError

MAX_MEMBER = 8 << 30  # one member larger than 8 GiB is not a real extension
MAX_TOTAL = 32 << 30  # nor is a wheel that unpacks to more than 32 GiB
MAX_RATIO = 200  # compression ratio above which a large member is a zip bomb
IN_MEMORY = 256 << 20  # members up to this size are read into memory, larger ones into the temp dir


def check_members(zf: zipfile.ZipFile, label: str) -> list[zipfile.ZipInfo]:
    """Validate every entry of the archive; AuditInputError names the first bad one."""
    seen: set[str] = set()
    total = 0
    members = []
    for info in zf.infolist():
        name = info.filename
        if name in seen:
            raise AuditInputError(f"{label}: duplicate zip entry {name!r}; expected every name once")
        seen.add(name)
        _check_name(name, label)
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            raise AuditInputError(f"{label}: zip entry {name!r} is a symlink; expected regular files only")
        if info.flag_bits & 0x1:
            raise AuditInputError(f"{label}: zip entry {name!r} is encrypted; expected plain entries")
        if info.file_size > MAX_MEMBER:
            raise AuditInputError(
                f"{label}: zip entry {name!r} claims {info.file_size} bytes; expected at most {MAX_MEMBER}"
            )
        if info.file_size > (64 << 20) and info.file_size > MAX_RATIO * max(info.compress_size, 1):
            raise AuditInputError(
                f"{label}: zip entry {name!r} expands {info.file_size // max(info.compress_size, 1)}x; "
                f"expected a ratio below {MAX_RATIO} (zip bomb?)"
            )
        total += info.file_size
        if total > MAX_TOTAL:
            raise AuditInputError(
                f"{label}: entries add up to more than {MAX_TOTAL} bytes; expected a real wheel"
            )
        if not name.endswith("/"):
            members.append(info)
    return members


def _check_name(name: str, label: str) -> None:
    """Refuse absolute paths, `..` components, backslashes and NULs (zip-slip)."""
    parts = PurePosixPath(name).parts
    if (
        name.startswith("/")
        or "\\" in name
        or "\0" in name
        or (len(name) > 1 and name[1] == ":")
        or ".." in parts
        or not parts
    ):
        raise AuditInputError(
            f"{label}: unsafe zip entry name {name!r}; expected a relative path inside the wheel"
        )


def read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, tmpdir: Path, index: int) -> bytes | Path:
    """Member contents: bytes when small, else a file in the private temp dir (never the member's name)."""
    try:
        if info.file_size <= IN_MEMORY:
            return zf.read(info)
        target = tmpdir / f"member-{index}"
        with zf.open(info) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
        return target
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise AuditInputError(
            f"zip entry {info.filename!r}: cannot be read ({exc}); expected an intact wheel"
        ) from None


def head(zf: zipfile.ZipFile, info: zipfile.ZipInfo, size: int = 18) -> bytes:
    """First bytes of a member (ELF sniffing) without reading all of it."""
    try:
        with zf.open(info) as fh:
            return fh.read(size)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise AuditInputError(
            f"zip entry {info.filename!r}: cannot be read ({exc}); expected an intact wheel"
        ) from None
