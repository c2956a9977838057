"""Turn command-line inputs (wheel, directory, .so files, installed distribution) into ELF candidates."""

from __future__ import annotations

import csv
import email.parser
import os
import re
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal

from .elf import ELF_MAGIC
from .errors import AuditInputError
from .wheelzip import MemberReader, check_members, head, read_file_text, read_member, read_text

_SO_NAME = re.compile(r"\.so(\.\d+)*$")


@dataclass(frozen=True)
class Candidate:
    """One file that may be an ELF shared object; `load()` returns its bytes, a path or a MemberReader."""

    path: str
    load: Callable[[], bytes | Path | MemberReader]
    named_so: bool
    size: int = 0  # bytes to read (uncompressed), to start the largest first


@dataclass(frozen=True)
class Source:
    """One input: its wheel tags and torch requirement (when known) and its candidate files."""

    label: str
    kind: str
    tags: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    candidates: tuple[Candidate, ...] = field(default=())
    requires_python: str | None = None


def _is_dyn_elf(head_bytes: bytes) -> bool:
    """ELF magic and e_type ET_DYN (3), either endianness."""
    if not head_bytes.startswith(ELF_MAGIC) or len(head_bytes) < 18:
        return False
    order: Literal["little", "big"] = "little" if head_bytes[5] == 1 else "big"
    return int.from_bytes(head_bytes[16:18], order) == 3


def _wheel_meta(text_of: Callable[[str], str | None]) -> tuple[tuple[str, ...], tuple[str, ...], str | None]:
    """Tags from WHEEL, Requires-Dist and Requires-Python from METADATA."""
    tags: list[str] = []
    requires: list[str] = []
    requires_python = None
    wheel = text_of("WHEEL")
    if wheel:
        tags = [v.strip() for k, _, v in (ln.partition(":") for ln in wheel.splitlines()) if k.strip() == "Tag"]
    meta = text_of("METADATA")
    if meta:
        headers = email.parser.Parser().parsestr(meta, headersonly=True)
        requires = headers.get_all("Requires-Dist") or []
        requires_python = headers.get("Requires-Python")
    return tuple(tags), tuple(requires), requires_python


def open_wheel(path: Path, zf: zipfile.ZipFile, fd: int | None = None) -> Source:
    """Candidates read straight from the zip (positional reads on `fd` when given); metadata from its .dist-info."""
    members = check_members(zf, str(path))
    dist_info = {
        m.filename.split("/", 1)[1]: m
        for m in members
        if m.filename.count("/") == 1 and m.filename.split("/")[0].endswith(".dist-info")
    }

    def text_of(name: str) -> str | None:
        info = dist_info.get(name)
        return read_text(zf, info, str(path), fd) if info else None

    tags, requires, requires_python = _wheel_meta(text_of)
    if not tags:
        parts = path.name[:-4].split("-")
        tags = (("-".join(parts[-3:])),) if len(parts) >= 5 else ()
    candidates = []
    for info in members:
        named = bool(_SO_NAME.search(info.filename))
        if named or (info.file_size >= 18 and _is_dyn_elf(head(zf, info, fd=fd))):
            candidates.append(Candidate(info.filename, partial(read_member, zf, info, fd), named, info.file_size))
    return Source(str(path), "wheel", _expand(tags), requires, tuple(candidates), requires_python)


def _expand(tags: tuple[str, ...]) -> tuple[str, ...]:
    """Expand compressed tags (cp310.cp311-abi3-linux_x86_64) into single ones."""
    out = []
    for tag in tags:
        pieces = tag.split("-")
        if len(pieces) != 3:
            continue
        out += [
            f"{p}-{a}-{pl}" for p in pieces[0].split(".") for a in pieces[1].split(".") for pl in pieces[2].split(".")
        ]
    return tuple(out)


def _walk(root: str) -> list[str]:
    """Regular files under root, symlinks skipped (os.scandir: file types come with the listing)."""
    out: list[str] = []
    stack = [root]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.is_symlink():
                    continue
                if entry.is_dir():
                    stack.append(entry.path)
                elif entry.is_file():
                    out.append(entry.path)
    return out


def _sniff(path: str) -> bool:
    """An ELF shared object by its first bytes (one open/read/close, no buffered file object)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return _is_dyn_elf(os.read(fd, 18))
    finally:
        os.close(fd)


def _scan_dir(root: Path, files: list[Path] | None = None) -> tuple[Candidate, ...]:
    """Regular files under root (symlinks skipped) that are named *.so[.N] or are ELF shared objects."""
    base = os.fspath(root)
    if files is None:
        paths = _walk(base)
    else:
        paths = [os.fspath(f) for f in files if not f.is_symlink() and f.is_file()]
    out = []
    prefix = base.rstrip(os.sep) + os.sep
    for path in sorted(paths):
        name = path.rsplit(os.sep, 1)[-1]
        named = bool(_SO_NAME.search(name))
        if not named and not _sniff(path):
            continue
        rel = path[len(prefix) :].replace(os.sep, "/") if path.startswith(prefix) else path
        out.append(Candidate(rel, partial(Path, path), named, os.stat(path).st_size))
    return tuple(out)


def open_path(arg: str) -> Source | None:
    """A directory or a single file; None when the path does not exist."""
    path = Path(arg)
    if path.is_dir():
        return Source(str(path), "directory", candidates=_scan_dir(path))
    if path.is_file():
        return Source(str(path), "file", candidates=(Candidate(path.name, lambda: path, True),))
    return None


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _dist_info(name: str) -> Path:
    """The `.dist-info` folder of installed distribution `name`: the first on sys.path, as importlib finds it."""
    want = _normalized(name)
    for entry in sys.path:
        base = Path(entry or ".")
        try:
            children = sorted(os.listdir(base))
        except OSError:
            continue
        for child in children:
            if child.endswith(".dist-info") and _normalized(child[: -len(".dist-info")].split("-")[0]) == want:
                return base / child
    raise AuditInputError(
        f"{name!r}: expected a .whl, a directory, a .so file or an installed distribution name; found none of these"
    )


def open_distribution(name: str) -> Source:
    """An installed distribution: its RECORD'ed files, tags from WHEEL, requirements from METADATA (each read
    through the bounded reader)."""
    folder = _dist_info(name)
    label = f"{name} (installed)"
    tags, requires, requires_python = _wheel_meta(lambda member: read_file_text(folder / member, label))
    record = read_file_text(folder / "RECORD", label) or ""
    try:
        files = [folder.parent / row[0] for row in csv.reader(record.splitlines()) if row]
    except csv.Error as exc:
        raise AuditInputError(f"{label}: {folder / 'RECORD'}: not a RECORD file ({exc})") from None
    return Source(
        label,
        "distribution",
        _expand(tags),
        requires,
        _scan_dir(folder.parent, [f for f in files if f.exists()]),
        requires_python,
    )
