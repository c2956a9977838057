"""Read a wheel straight from its zip: refuse zip-slip names, symlinks, absurd sizes, duplicates."""

from __future__ import annotations

import stat
import struct
import zipfile
from collections.abc import Callable
from pathlib import PurePosixPath

from .errors import AuditInputError

MAX_MEMBER = 8 << 30  # one member larger than 8 GiB is not a real extension
MAX_TOTAL = 32 << 30  # nor is a wheel that unpacks to more than 32 GiB
MAX_RATIO = 200  # compression ratio above which a large member is a zip bomb
HEAD_WINDOW = 64 << 20  # bytes kept from the start of a member (MemberReader)
CHUNK = 1 << 20  # inflate this many bytes per read; pieces are kept as they come


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


def read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> MemberReader:
    """Member contents as a streamed, chunked view (nothing is written to disk)."""
    return MemberReader(zf, info)


def _unreadable(info: zipfile.ZipInfo, exc: Exception) -> AuditInputError:
    return AuditInputError(f"zip entry {info.filename!r}: cannot be read ({exc}); expected an intact wheel")


class MemberReader:
    """Random access to a member, inflated in CHUNK pieces that are kept as they come (no big buffer).

    One streaming pass keeps the first HEAD_WINDOW bytes (all of a typical member), the PT_DYNAMIC
    segment and the section header table; a read outside those costs one more pass over the member.
    zipfile checks the member's CRC at the end of every pass.
    """

    def __init__(self, zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> None:
        self.zf, self.info, self.size = zf, info, info.file_size
        self.kept: list[tuple[int, bytes]] = []  # (offset, bytes), sorted by offset
        self._pass(_plan)

    def read(self, offset: int, size: int) -> bytes:
        """Bytes [offset, offset + size), short at the end of the member like a file read."""
        end = min(offset + size, self.size)
        if offset >= end:
            return b""
        got = self._cover(offset, end)
        if got is None:
            self._pass(lambda _head: [(offset, end)])
            got = self._cover(offset, end)
        if got is None:  # the member is shorter than its directory entry says
            raise _unreadable(self.info, EOFError(f"no bytes at offset {offset}"))
        return got

    def _cover(self, lo: int, hi: int) -> bytes | None:
        """[lo, hi) from kept pieces, or None when a part of it was not kept."""
        out: list[bytes] = []
        for start, data in self.kept:
            if start <= lo < start + len(data):
                out.append(data[lo - start : hi - start] if (lo, hi) != (start, start + len(data)) else data)
                lo += len(out[-1])
                if lo >= hi:
                    return out[0] if len(out) == 1 else b"".join(out)
        return None

    def _pass(self, plan: Callable[[bytes], list[tuple[int, int]]]) -> None:
        """Stream the member once, keeping the pieces of the ranges `plan(first chunk)` asks for."""
        wanted: list[tuple[int, int]] = []
        pos = 0
        try:
            with self.zf.open(self.info) as fh:
                while chunk := fh.read(CHUNK):
                    if not pos:
                        wanted = _merge(plan(chunk))
                    end = pos + len(chunk)
                    for lo, hi in wanted:
                        if lo <= pos and end <= hi:
                            self.kept.append((pos, chunk))
                        elif lo < end and hi > pos:
                            self.kept.append((max(lo, pos), chunk[max(lo - pos, 0) : min(hi, end) - pos]))
                    pos = end
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
            raise _unreadable(self.info, exc) from None
        self.kept.sort(key=lambda piece: piece[0])


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, non-overlapping union of half-open ranges."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(r for r in ranges if r[0] < r[1]):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _plan(head: bytes) -> list[tuple[int, int]]:
    """Ranges worth keeping from an ELF object, judged from its first bytes (best effort)."""
    out = [(0, HEAD_WINDOW)]
    if head[:4] != b"\x7fELF" or len(head) < 64 or head[4] not in (1, 2) or head[5] not in (1, 2):
        return out
    is64, e = head[4] == 2, "<" if head[5] == 1 else ">"
    phoff, shoff, _f, _eh, phent, phnum, shent, shnum = struct.unpack_from(
        e + ("QQIHHHHH" if is64 else "IIIHHHHH"), head, 32 if is64 else 28
    )
    out.append((shoff, shoff + shent * shnum))
    for i in range(phnum):
        at = phoff + i * phent
        if at + phent > len(head) or phent < (56 if is64 else 32):
            break
        ph = struct.unpack_from(e + ("IIQQQQ" if is64 else "IIIIII"), head, at)
        offset, filesz = (ph[2], ph[5]) if is64 else (ph[1], ph[4])
        if ph[0] == 2:  # PT_DYNAMIC
            out.append((offset, offset + filesz))
    return out


def head(zf: zipfile.ZipFile, info: zipfile.ZipInfo, size: int = 18) -> bytes:
    """First bytes of a member (ELF sniffing) without reading all of it."""
    try:
        with zf.open(info) as fh:
            return fh.read(size)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise AuditInputError(
            f"zip entry {info.filename!r}: cannot be read ({exc}); expected an intact wheel"
        ) from None
