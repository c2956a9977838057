"""Where the inventory reads source files from: a folder or files on disk (read as needed), or a
source archive (`.tar.gz`, `.tgz`, `.tar`, `.tar.bz2`, `.tar.xz`, `.zip`) read in place, with bounds
on every size a hostile archive could inflate (exit 2 naming the bound)."""

from __future__ import annotations

import os
import stat
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..errors import AuditInputError
from ..wheelzip import check_members

MAX_FILE = 16 << 20  # one source file (vLLM's largest is 0.3 MiB)
MAX_TOTAL = 512 << 20  # source text of one input
MAX_FILES = 200_000  # source files of one input
MAX_STREAM = 4 << 30  # bytes an archive may inflate to while it is read (the sdists measured: < 0.5 GiB)
ARCHIVES = (".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".zip")


def _over_file(label: str, rel: str) -> AuditInputError:
    return AuditInputError(
        f"{label}: {rel} is over {MAX_FILE >> 20} MiB; the inventory reads source files up to that size"
    )


def _over_total(label: str) -> AuditInputError:
    return AuditInputError(f"{label}: over {MAX_TOTAL >> 20} MiB of source text; the inventory reads up to that much")


def _over_files(label: str) -> AuditInputError:
    return AuditInputError(f"{label}: over {MAX_FILES} source files; the inventory reads up to that many per input")


class Tree:
    """Source files under one root, by POSIX path relative to it."""

    label: str

    def exists(self, rel: str) -> bool:
        raise NotImplementedError

    def read(self, rel: str) -> str:
        raise NotImplementedError

    def walk(self) -> list[str]:
        raise NotImplementedError

    def has_dir(self, rel: str) -> bool:
        raise NotImplementedError


def _decode(data: bytes, label: str, rel: str) -> str:
    if len(data) > MAX_FILE:
        raise _over_file(label, rel)
    return data.decode("utf-8", errors="replace")


class DiskTree(Tree):
    """A folder; files are read when asked for (and the reads counted against MAX_TOTAL)."""

    def __init__(self, root: Path, suffixes: frozenset[str]) -> None:
        self.root = root
        self.label = str(root)
        self.suffixes = suffixes
        self.total = 0

    def _path(self, rel: str) -> Path:
        return self.root.joinpath(*PurePosixPath(rel).parts)

    def exists(self, rel: str) -> bool:
        try:
            return stat.S_ISREG(self._path(rel).stat().st_mode)
        except (OSError, ValueError):
            return False

    def has_dir(self, rel: str) -> bool:
        try:
            return self._path(rel).is_dir()
        except (OSError, ValueError):
            return False

    def read(self, rel: str) -> str:
        path = self._path(rel)
        try:
            with open(path, "rb") as fh:
                if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                    raise AuditInputError(f"{self.label}: {rel} is not a regular file")
                data = fh.read(MAX_FILE + 1)
        except OSError as exc:
            raise AuditInputError(f"{self.label}: cannot read {rel}: {exc.strerror or exc}") from exc
        self.total += len(data)
        if self.total > MAX_TOTAL:
            raise _over_total(self.label)
        return _decode(data, self.label, rel)

    def walk(self) -> list[str]:
        out: list[str] = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            base = PurePosixPath(*Path(dirpath).relative_to(self.root).parts)
            for name in sorted(filenames):
                if os.path.splitext(name)[1].lower() in self.suffixes:
                    out.append(str(base / name) if str(base) != "." else name)
                    if len(out) > MAX_FILES:
                        raise _over_files(self.label)
        return out


class MemoryTree(Tree):
    """The source files of an archive, held in memory (bounded by MAX_TOTAL)."""

    def __init__(self, label: str, files: dict[str, str]) -> None:
        self.label = label
        self.files = files
        self._dirs: set[str] | None = None

    def exists(self, rel: str) -> bool:
        return rel in self.files

    def has_dir(self, rel: str) -> bool:
        if self._dirs is None:
            self._dirs = {str(p) for rel_ in self.files for p in PurePosixPath(rel_).parents}
        return rel in self._dirs

    def read(self, rel: str) -> str:
        return self.files[rel]

    def walk(self) -> list[str]:
        return sorted(self.files)


@dataclass
class _Budget:
    label: str
    total: int = 0
    stream: int = 0
    files: int = 0

    def member(self, name: str, size: int, source: bool) -> None:
        """Count one archive member before it is inflated; refuse past a bound."""
        self.stream += size
        if self.stream > MAX_STREAM:
            raise AuditInputError(
                f"{self.label}: members add up to over {MAX_STREAM >> 30} GiB; "
                "the inventory inflates up to that much of an archive"
            )
        if source:
            if size > MAX_FILE:
                raise _over_file(self.label, name)
            self.total += size
            self.files += 1
            if self.total > MAX_TOTAL:
                raise _over_total(self.label)
            if self.files > MAX_FILES:
                raise _over_files(self.label)


def _member_name(name: str, label: str) -> str:
    parts = PurePosixPath(name).parts
    if name.startswith("/") or "\\" in name or "\0" in name or ".." in parts:
        raise AuditInputError(f"{label}: archive member {name!r} escapes the archive; expected relative paths")
    return "/".join(p for p in parts if p != ".")


def _strip_top(files: dict[str, str]) -> dict[str, str]:
    """An sdist's single top-level folder (`vllm-0.34.0/`) is dropped from every path."""
    tops = {rel.split("/", 1)[0] for rel in files}
    if len(tops) == 1 and all("/" in rel for rel in files):
        return {rel.split("/", 1)[1]: text for rel, text in files.items()}
    return files


def read_archive(path: Path, suffixes: frozenset[str]) -> MemoryTree:
    """Every source file of an archive, read in place."""
    label = str(path)
    budget = _Budget(label)
    files: dict[str, str] = {}

    def wanted(name: str) -> bool:
        return os.path.splitext(name)[1].lower() in suffixes

    try:
        if path.name.lower().endswith(".zip"):
            with zipfile.ZipFile(path) as zf:
                for info in check_members(zf, label):
                    rel = _member_name(info.filename, label)
                    budget.member(rel, info.file_size, wanted(rel))
                    if wanted(rel):
                        with zf.open(info) as fh:
                            files[rel] = _decode(fh.read(MAX_FILE + 1), label, rel)
        else:
            with tarfile.open(path, mode="r|*") as tf:
                for member in tf:
                    rel = _member_name(member.name, label)
                    source = member.isreg() and wanted(rel)
                    budget.member(rel, member.size if member.isreg() else 0, source)
                    if source:
                        stream = tf.extractfile(member)
                        if stream is not None:
                            files[rel] = _decode(stream.read(MAX_FILE + 1), label, rel)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError, ValueError, zlib.error) as exc:
        raise AuditInputError(f"{label}: cannot read the archive: {exc}") from exc
    return MemoryTree(label, _strip_top(files))


def is_archive(path: Path) -> bool:
    return path.name.lower().endswith(ARCHIVES)
