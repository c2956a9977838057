"""One input (a folder, an archive, or files on disk) as a project: its source files scanned, the
project's own includes followed, third-party trees left out unless asked for, and the
TORCH_TARGET_VERSION each file (with what it includes) and the whole project need."""

from __future__ import annotations

import os
import posixpath
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ..errors import AuditInputError
from .knowledge import BASELINE, Knowledge, Version
from .scan import FileScan, Finding, Scanner
from .sources import DiskTree, Tree, is_archive, read_archive

MAX_INCLUDE_DEPTH = 200  # GCC's limit on nested #include


@dataclass
class FileResult:
    """One file of a project: its findings and what it needs with everything it includes."""

    path: str
    named: bool  # given (or found under a given folder), not only reached through an include
    scan: FileScan
    findings: list[Finding]
    target: Version | None = None
    build: Version | None = None


@dataclass
class Project:
    """The inventory of one input."""

    label: str
    prefix: str  # put before a file's path when shown: the folder given, as given
    files: dict[str, FileResult] = field(default_factory=dict)
    third_party: list[str] = field(default_factory=list)  # folders left out

    @property
    def findings(self) -> list[tuple[str, Finding]]:
        """(shown path, finding) in path and source order."""
        return [(self.prefix + path, f) for path, r in sorted(self.files.items()) for f in r.findings]

    @property
    def target(self) -> Version | None:
        found = [r.target for r in self.files.values() if r.target]
        return max(found) if found else None

    @property
    def build(self) -> Version | None:
        found = [r.build for r in self.files.values() if r.build]
        return max(found) if found else None


def _third_party(rel: str, know: Knowledge, tree: Tree) -> str | None:
    """The vendored folder (as a path prefix) `rel` lies in, or None: a `third_party/`-like folder,
    or a folder named like a library (cutlass, composable_kernel, ...) that has an include/ folder."""
    parts = PurePosixPath(rel).parts[:-1]
    for i, part in enumerate(parts):
        folder = "/".join(parts[: i + 1])
        if part.lower() in know.third_party:
            return folder
        if part in know.third_party_libraries and tree.has_dir(folder + "/include"):
            return folder
    return None


def _resolve(tree: Tree, including: str, header: str, include_dirs: list[str]) -> str | None:
    """A project file an `#include` names: relative to the including file's folder, then to each
    folder above it up to the root, then to each -I folder."""
    if header.startswith("/") or "\\" in header:
        return None
    folder = posixpath.dirname(including)
    while True:
        rel = posixpath.normpath(posixpath.join(folder, header))
        if not rel.startswith("../") and rel != ".." and tree.exists(rel):
            return rel
        if not folder:
            break
        folder = posixpath.dirname(folder)
    for folder in include_dirs:
        rel = posixpath.normpath(posixpath.join(folder, header))
        if not rel.startswith("../") and tree.exists(rel):
            return rel
    return None


class _Suffixes:
    """The files of a tree by path suffix: where a build's -I folders are not known, an include
    `"stable/library.h"` is the file ending in `/stable/library.h`, the one nearest the includer."""

    def __init__(self, files: list[str]) -> None:
        self.by_name: dict[str, list[str]] = {}
        for rel in files:
            self.by_name.setdefault(posixpath.basename(rel), []).append(rel)

    def find(self, including: str, header: str) -> str | None:
        header = posixpath.normpath(header)
        if header.startswith("../"):
            return None
        found = [r for r in self.by_name.get(posixpath.basename(header), ()) if ("/" + r).endswith("/" + header)]
        if not found:
            return None
        parts = including.split("/")

        def shared(rel: str) -> int:
            n = 0
            for a, b in zip(parts, rel.split("/"), strict=False):
                if a != b:
                    break
                n += 1
            return n

        return max(found, key=lambda r: (shared(r), -len(r)))


class _Analysis:
    """Scans the named files and follows their includes breadth-first."""

    def __init__(
        self,
        tree: Tree,
        know: Knowledge,
        scanner: Scanner,
        third_party: bool,
        include_dirs: list[str],
        files: list[str],
    ) -> None:
        self.tree = tree
        self.include_dirs = include_dirs
        self.suffixes = _Suffixes(files)
        self.know = know
        self.scanner = scanner
        self.keep_third_party = third_party
        self.scans: dict[str, FileScan] = {}
        self.edges: dict[str, list[str]] = {}
        self.excluded: set[str] = set()

    def run(self, named: list[str]) -> Project:
        depth = dict.fromkeys(named, 0)
        queue = deque(named)
        while queue:
            rel = queue.popleft()
            scan = self.scanner.scan(self.tree.read(rel))
            self.scans[rel] = scan
            self.edges[rel] = []
            for inc in scan.includes:
                target = _resolve(self.tree, rel, inc.header, self.include_dirs)
                if target is None and inc.quoted:
                    target = self.suffixes.find(rel, inc.header)
                if target is None or not self._wanted(target):
                    continue
                self.edges[rel].append(target)
                if target not in depth:
                    depth[target] = depth[rel] + 1
                    if depth[target] > MAX_INCLUDE_DEPTH:
                        raise AuditInputError(
                            f"{self.tree.label}: {target} is included {depth[target]} levels deep; "
                            f"the inventory follows #include up to {MAX_INCLUDE_DEPTH} levels (GCC's limit)"
                        )
                    queue.append(target)
        return self._project(set(named))

    def _wanted(self, rel: str) -> bool:
        if self.keep_third_party:
            return True
        folder = _third_party(rel, self.know, self.tree)
        if folder is not None:
            self.excluded.add(folder)
            return False
        return True

    def _closure(self, start: str) -> list[str]:
        seen = {start}
        stack = [start]
        while stack:
            for nxt in self.edges.get(stack.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return sorted(seen)

    def _project(self, named: set[str]) -> Project:
        project = Project(self.tree.label, "", third_party=sorted(self.excluded))
        for rel, scan in self.scans.items():
            closure = self._closure(rel)
            defined = set().union(*(self.scans[c].defines for c in closure))
            findings = [f for f in scan.findings if not (f.kind == "macro" and f.what in defined)]
            scan.findings = findings
            project.files[rel] = FileResult(rel, rel in named, scan, findings)
        for rel, result in project.files.items():
            closure = self._closure(rel)
            targets = [t for c in closure if (t := project.files[c].scan.target())]
            builds = [b for c in closure if (b := project.files[c].scan.build())]
            result.target = max(targets) if targets else None
            result.build = max(builds) if builds else None
        return project


def analyse(
    inputs: list[str],
    know: Knowledge,
    *,
    third_party: bool = False,
    cwd: Path | None = None,
    trees: dict[str, Tree] | None = None,
    include_dirs: list[str] | None = None,
) -> list[Project]:
    """One Project per folder or archive given, plus one for all the files given directly (rooted at
    the working directory when they and the -I folders lie under it, else at their common folder).
    `trees` receives each project's file source by label (--fix reads the files again)."""
    trees = {} if trees is None else trees
    dirs = [str(PurePosixPath(*Path(d).parts)) for d in include_dirs or []]
    scanner = Scanner(know)
    cwd = (cwd or Path.cwd()).resolve()
    projects: list[Project] = []
    loose: list[Path] = []
    for text in inputs:
        path = Path(text)
        if path.is_dir():
            disk = DiskTree(path, know.suffixes)
            files = disk.walk()
            project = _run(disk, files, files, know, scanner, third_party, text, dirs)
            trees[project.label] = disk
            project.prefix = "" if path.resolve() == cwd else str(PurePosixPath(*Path(text).parts)) + "/"
            projects.append(project)
        elif path.is_file() and is_archive(path):
            archive = read_archive(path, know.suffixes)
            files = archive.walk()
            projects.append(_run(archive, files, files, know, scanner, third_party, text, dirs))
            trees[text] = archive
        elif path.is_file():
            loose.append(path.resolve())
        else:
            raise AuditInputError(
                f"{text}: no such file or folder; expected a source folder, a source file or an sdist"
            )
    if loose:
        extra = [(cwd / d).resolve() for d in include_dirs or []]
        inside = all(p.is_relative_to(cwd) for p in loose + extra)
        root = cwd if inside else Path(os.path.commonpath([p.parent for p in loose] + extra))
        rels = sorted({str(PurePosixPath(*p.relative_to(root).parts)) for p in loose})
        rooted = [str(PurePosixPath(*d.relative_to(root).parts)) or "." for d in extra]
        tree = DiskTree(root, know.suffixes)
        projects.append(_run(tree, rels, [], know, scanner, third_party, str(root), rooted))
        trees[str(root)] = tree
    return projects


def _run(
    tree: Tree,
    named: list[str],
    files: list[str],
    know: Knowledge,
    scanner: Scanner,
    third_party: bool,
    label: str,
    include_dirs: list[str],
) -> Project:
    """Analyse one tree from its named files (`files`: all of the tree's, for the suffix search)."""
    analysis = _Analysis(tree, know, scanner, third_party, include_dirs, files)
    wanted = [rel for rel in named if analysis._wanted(rel)]
    project = analysis.run(wanted)
    project.label = label
    return project


def floor_text(version: Version | None) -> str:
    return "-" if version is None else ".".join(map(str, version))


__all__ = ["BASELINE", "FileResult", "Project", "analyse", "floor_text"]
