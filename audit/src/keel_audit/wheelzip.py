"""Read a wheel straight from its zip: refuse zip-slip names, symlinks, absurd sizes, duplicates. Every member
is read through a bounded reader: libraries through `MemberReader` (windows, never whole), metadata text
(METADATA, WHEEL, RECORD, torch/version.py) through `read_text` (at most MAX_METADATA bytes)."""

from __future__ import annotations

import importlib
import os
import stat
import struct
import zipfile
import zlib
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Protocol

from .errors import AuditInputError


def _inflater() -> ModuleType:
    """ISA-L's zlib module when installed (it inflates about twice as fast: `pip install keel-audit[fast]`),
    else zlib. Imported by name, so that type-checking does not depend on the optional extra."""
    try:
        return importlib.import_module("isal.isal_zlib")
    except ImportError:  # pragma: no cover - depends on the environment
        return zlib


_inflate_lib = _inflater()
# what reading a damaged member can raise, from zipfile, the OS, zlib or ISA-L
_READ_ERRORS: tuple[type[BaseException], ...] = (
    zipfile.BadZipFile,
    OSError,
    EOFError,
    ValueError,
    zlib.error,
    _inflate_lib.error,
)

MAX_MEMBER = 8 << 30  # one member larger than 8 GiB is not a real extension
MAX_TOTAL = 32 << 30  # nor is a wheel that unpacks to more than 32 GiB
MAX_RATIO = 200  # compression ratio above which a member over 64 MiB is a zip bomb
# (size, ratio): a member larger than `size` compressing better than `ratio` is one too (torch's and the
# nvidia-* libraries of a GB compress 2-4x; an inflated GB costs seconds)
RATIO_TIERS = ((1 << 30, 8), (256 << 20, 32), (64 << 20, MAX_RATIO))
MAX_METADATA = 16 << 20  # a metadata text member (METADATA, WHEEL, RECORD, version.py) larger than this is not real
HEAD_WINDOW = 64 << 20  # bytes kept from the start of a member (MemberReader)
CHUNK = 1 << 20  # inflate at most this many bytes per read; pieces are kept as they come
MIN_READ = 64 << 10  # and at least this many (no tiny reads for headers)
BACK_WINDOW = 8 << 20  # bytes kept before each range read: a table just behind it needs no second pass
KEEP_LIMIT = 96 << 20  # range pieces kept past the head window; beyond it they are dropped before a new read
_LOCAL_HEADER = 30  # bytes of a local file header before its name


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
        _check_ratio(info, label)
        total += info.file_size
        if total > MAX_TOTAL:
            raise AuditInputError(f"{label}: entries add up to more than {MAX_TOTAL} bytes; expected a real wheel")
        if not name.endswith("/"):
            members.append(info)
    _check_overlaps(zf, label)
    return members


def _check_ratio(info: zipfile.ZipInfo, label: str) -> None:
    """Refuse a large member that compresses better than its size's tier allows (RATIO_TIERS)."""
    for size, ratio in RATIO_TIERS:
        if info.file_size > size and info.file_size > ratio * max(info.compress_size, 1):
            raise AuditInputError(
                f"{label}: zip entry {info.filename!r} expands {info.file_size // max(info.compress_size, 1)}x to "
                f"{info.file_size} bytes; expected a ratio below {ratio} for a member over {size >> 20} MiB (zip bomb?)"
            )


def read_text(zf: zipfile.ZipFile, info: zipfile.ZipInfo, label: str, fd: int | None = None) -> str:
    """A metadata member's text (UTF-8, errors replaced), read through MemberReader; AuditInputError naming
    the member when it is larger than MAX_METADATA."""
    if info.file_size > MAX_METADATA:
        raise AuditInputError(
            f"{label}: zip entry {info.filename!r} holds {info.file_size} bytes; expected at most {MAX_METADATA} "
            "for a metadata file"
        )
    return MemberReader(zf, info, fd).read(0, info.file_size).decode("utf-8", "replace")


def read_file_text(path: Path, label: str) -> str | None:
    """An installed metadata file's text (UTF-8, errors replaced), None when it is missing; AuditInputError
    naming it when it is not a regular file of at most MAX_METADATA bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise AuditInputError(f"{label}: {path}: cannot be read ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        what = f"{st.st_size} bytes" if stat.S_ISREG(st.st_mode) else "not a regular file"
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_METADATA:
            raise AuditInputError(
                f"{label}: {path} is {what}; expected a metadata file of at most {MAX_METADATA} bytes"
            )
        pieces, size = [], 0
        while size <= MAX_METADATA and (piece := os.read(fd, MAX_METADATA + 1 - size)):
            pieces.append(piece)
            size += len(piece)
    finally:
        os.close(fd)
    if size > MAX_METADATA:
        raise AuditInputError(f"{label}: {path} grew past {MAX_METADATA} bytes while being read")
    return b"".join(pieces).decode("utf-8", "replace")


def _check_overlaps(zf: zipfile.ZipFile, label: str) -> None:
    """Refuse entries whose bytes overlap (several central entries naming one local header, or local
    data running into the next entry or the central directory: the overlapping zip bomb). Each entry
    spans at least its local header, its name and its compressed data."""
    spans = []
    for info in zf.infolist():
        try:
            name_len = len(info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437"))
        except UnicodeEncodeError:
            name_len = len(info.orig_filename.encode("utf-8", "surrogateescape"))
        spans.append((info.header_offset, info.header_offset + _LOCAL_HEADER + name_len + info.compress_size, info))
    spans.sort(key=lambda span: span[0])
    bad: list[str] = []
    for (_, end, info), (start, _, after) in zip(spans, spans[1:], strict=False):
        if end > start:
            bad += [n for n in (info.filename, after.filename) if n not in bad]
    directory = getattr(zf, "start_dir", None)
    if spans and isinstance(directory, int) and spans[-1][1] > directory:
        bad.append(spans[-1][2].filename)
        bad.append("(the central directory)")
    if bad:
        shown = ", ".join(repr(n) for n in bad[:6]) + (f" and {len(bad) - 6} more" if len(bad) > 6 else "")
        raise AuditInputError(
            f"{label}: zip entries overlap: {shown} share bytes of the archive; "
            "expected every entry's data in a range of its own (overlapping entries are a zip bomb)"
        )


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
        raise AuditInputError(f"{label}: unsafe zip entry name {name!r}; expected a relative path inside the wheel")


def read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, fd: int | None = None) -> MemberReader:
    """Member contents as a streamed, chunked view (nothing is written to disk).

    With `fd` (the wheel opened read-only), deflated and stored members are read with positional
    reads and inflated by ISA-L when installed (zlib otherwise), so several members can be read by
    several threads at once; without it, through zipfile.
    """
    return MemberReader(zf, info, fd)


class _RawStream:
    """A deflated or stored member read straight from the archive: positional reads, ISA-L or zlib,
    CRC-32 checked when the stream reaches the member's end."""

    IN_CHUNK = 256 << 10

    def __init__(self, fd: int, info: zipfile.ZipInfo, first: int = 0) -> None:
        """`first`: compressed bytes to read together with the local header (one read for a sniff)."""
        guess = 30 + len(info.orig_filename.encode()) + len(info.extra)
        block = os.pread(fd, guess + min(first, info.compress_size), info.header_offset)
        if len(block) < 30 or block[:4] != b"PK\x03\x04":
            raise zipfile.BadZipFile(f"bad local file header for {info.filename!r}")
        name_len, extra_len = struct.unpack_from("<HH", block, 26)
        self.fd, self.info = fd, info
        self.at = info.header_offset + 30 + name_len + extra_len
        self.end = self.at + info.compress_size
        self.inflate = _inflate_lib.decompressobj(-15) if info.compress_type == zipfile.ZIP_DEFLATED else None
        skip = 30 + name_len + extra_len
        self.tail = block[skip : skip + info.compress_size] if first else b""  # compressed input not consumed yet
        self.at += len(self.tail)
        self.out = 0
        self.crc = 0

    def read(self, n: int) -> bytes:
        """Up to `n` more bytes of the member (fewer is fine); b"" at its end."""
        while True:
            if not self.tail and self.at < self.end:
                self.tail = os.pread(self.fd, min(self.IN_CHUNK, self.end - self.at), self.at)
                if not self.tail:
                    raise EOFError("archive ends inside the member")
                self.at += len(self.tail)
            if self.inflate is None:
                data, self.tail = self.tail[:n], self.tail[n:]
            elif not self.inflate.eof:  # also with no input left: inflated output may be pending
                data = self.inflate.decompress(self.tail, n)
                self.tail = self.inflate.unconsumed_tail
            else:
                data = b""
            if data or (not self.tail and self.at >= self.end):
                break
        size = self.info.file_size
        if not data:
            if self.out != size:
                raise EOFError(f"{self.info.filename!r} ends after {self.out} of {size} bytes")
            if size == 0 and self.info.CRC != 0:
                raise zipfile.BadZipFile(f"Bad CRC-32 for file {self.info.filename!r}")
            return b""
        self.out += len(data)
        self.crc = _inflate_lib.crc32(data, self.crc)
        if self.out > size:
            raise zipfile.BadZipFile(f"{self.info.filename!r} inflates past its size {size}")
        if self.out == size and self.crc != self.info.CRC:
            raise zipfile.BadZipFile(f"Bad CRC-32 for file {self.info.filename!r}")
        return data

    def close(self) -> None:
        self.tail = b""


class _Stream(Protocol):
    """A member's bytes in order: zipfile's own stream or _RawStream."""

    def read(self, n: int, /) -> bytes: ...

    def close(self) -> None: ...


def _unreadable(info: zipfile.ZipInfo, exc: BaseException) -> AuditInputError:
    return AuditInputError(f"zip entry {info.filename!r}: cannot be read ({exc}); expected an intact wheel")


class MemberReader:
    """Random access to a member, inflated lazily from its start, only as far as reads reach.

    Pieces in the first HEAD_WINDOW bytes and every range read (with BACK_WINDOW bytes before it:
    patchelf'ed libraries such as torch's keep .gnu.hash just before .dynstr, both at the end) are
    kept as they come (no big buffer); a read behind the stream outside those restarts the stream.
    Past KEEP_LIMIT bytes of range pieces, they are dropped before the next read that needs the stream
    (the head window stays), so one reader holds at most about HEAD_WINDOW + KEEP_LIMIT + one range.
    zipfile checks the CRC when a pass reaches the end of the member: the section-header path (which reads the table at
    the end) checks it, the dynamic-segment path (elf/segments.py) usually stops early and does not.
    """

    streamed = True  # elf.read_elf tries the dynamic segment first

    def __init__(self, zf: zipfile.ZipFile, info: zipfile.ZipInfo, fd: int | None = None) -> None:
        self.zf, self.info, self.size, self.fd = zf, info, info.file_size, fd
        self.kept: list[tuple[int, bytes]] = []  # (offset, bytes), sorted by offset
        self.kept_bytes = 0
        self.pos = 0  # bytes inflated by the current pass
        self.passes = 0
        self._fh: _Stream | None = None

    def read(self, offset: int, size: int) -> bytes:
        """Bytes [offset, offset + size), short at the end of the member like a file read."""
        end = min(offset + size, self.size)
        if offset >= end:
            return b""
        got = self._cover(offset, end)
        if got is None:
            self._advance(offset, end)
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

    def _advance(self, lo: int, hi: int) -> None:
        """Inflate up to `hi` (restarting when [lo, pos) was not kept), keeping [lo, hi) and the head window."""
        try:
            if self.kept_bytes > KEEP_LIMIT:  # drop the range pieces; the head window stays
                self.kept = [piece for piece in self.kept if piece[0] + len(piece[1]) <= HEAD_WINDOW]
                self.kept_bytes = sum(len(data) for _, data in self.kept)
            if self._fh is None or (lo < self.pos and self._cover(lo, min(hi, self.pos)) is None):
                if self._fh is not None:
                    self._fh.close()
                self._fh, self.pos = self._open(), 0
                self.passes += 1
            while self.pos < hi:
                chunk = self._fh.read(min(CHUNK, max(hi - self.pos, MIN_READ)))
                if not chunk:
                    break
                pos, end = self.pos, self.pos + len(chunk)
                for keep_lo, keep_hi in ((0, HEAD_WINDOW), (max(lo - BACK_WINDOW, 0), hi)):
                    if keep_lo <= pos and end <= keep_hi:
                        self._keep(pos, chunk)
                        break
                    if keep_lo < end and keep_hi > pos:
                        self._keep(max(keep_lo, pos), chunk[max(keep_lo - pos, 0) : min(keep_hi, end) - pos])
                self.pos = end
            if self.pos >= self.size:  # read past the end: zipfile checks the CRC here
                self._fh.read(1)
                self._fh.close()
                self._fh = None
        except _READ_ERRORS as exc:
            raise _unreadable(self.info, exc) from None
        self.kept.sort(key=lambda piece: piece[0])

    def _open(self) -> _Stream:
        if self.fd is not None and self.info.compress_type in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            return _RawStream(self.fd, self.info)
        return self.zf.open(self.info)

    def _keep(self, offset: int, data: bytes) -> None:
        if not self._cover(offset, offset + len(data)):
            self.kept.append((offset, data))
            self.kept_bytes += len(data)


def head(zf: zipfile.ZipFile, info: zipfile.ZipInfo, size: int = 18, fd: int | None = None) -> bytes:
    """First bytes of a member (ELF sniffing) without reading all of it (with `fd`: one positional
    read of its first compressed bytes, no zipfile machinery per member)."""
    if fd is not None and info.compress_type in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        try:
            stream = _RawStream(fd, info, first=1024)  # a deflate block header fits, usually
            stream.IN_CHUNK = 4096
            out = b""
            while len(out) < size and (piece := stream.read(size - len(out))):
                out += piece
            return out
        except _READ_ERRORS as exc:
            raise _unreadable(info, exc) from None
    try:
        with zf.open(info) as fh:
            return fh.read(size)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise AuditInputError(
            f"zip entry {info.filename!r}: cannot be read ({exc}); expected an intact wheel"
        ) from None
