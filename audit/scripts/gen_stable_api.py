"""Rebuild audit/src/keel_audit/data/stable_api.json: which LibTorch stable API exists since which
torch release, read from the headers of real torch releases.

For every release given (oldest first) it reads torch/include/torch/csrc/stable/**,
torch/include/torch/headeronly/** and, where a release ships it,
torch/csrc/stable/c/shim_function_versions.txt, and records per macro, C++ name (namespace scope
and class members) and C shim function: the first release whose headers declare it (`since`), the
TORCH_FEATURE_VERSION guard it sits under there (`guard`), and the first release that no longer has
it (`removed`). Each header file is recorded with its `since` as well.

A --torch is a torch wheel, an installed torch package directory, or a version: a version is read
straight from the registry's file host with HTTP range requests on the wheel's zip directory and
the few header members (about 1 MB per release; nothing is downloaded whole or installed):

    PYTHONPATH=audit/src python audit/scripts/gen_stable_api.py \
        --torch 2.9.1 2.10.0 2.11.0 2.12.1 2.13.0 2.14.1 2.15.0
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import re
import sys
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

from keel_audit.inventory.declarations import Declarations, declarations

ROOT = Path(__file__).resolve().parents[1]  # audit/
OUT = ROOT / "src/keel_audit/data/stable_api.json"
PREFIXES = ("include/torch/csrc/stable/", "include/torch/headeronly/")
VERSIONS_FILE = ("csrc/stable/c/shim_function_versions.txt", "include/torch/csrc/stable/c/shim_function_versions.txt")
PYPI = "https://pypi.org/pypi"
BLOCK = 1 << 18


class HttpRangeFile(io.RawIOBase):
    """A read-only, seekable view of a remote file through HTTP range requests (blocks cached)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.pos = 0
        self.blocks: dict[int, bytes] = {}
        self.requests = 0
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=60) as r:
            self.size = int(r.headers["Content-Length"])

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 else self.size + offset
        return self.pos

    def _block(self, index: int) -> bytes:
        if index not in self.blocks:
            start = index * BLOCK
            end = min(start + BLOCK, self.size) - 1
            req = urllib.request.Request(self.url, headers={"Range": f"bytes={start}-{end}"})
            with urllib.request.urlopen(req, timeout=120) as r:
                if r.status != 206:
                    raise SystemExit(f"gen_stable_api: {self.url}: no range support (HTTP {r.status})")
                self.blocks[index] = r.read()
            self.requests += 1
        return self.blocks[index]

    def read(self, size: int = -1) -> bytes:
        end = self.size if size < 0 else min(self.size, self.pos + size)
        out = bytearray()
        while self.pos < end:
            block = self._block(self.pos // BLOCK)
            offset = self.pos % BLOCK
            piece = block[offset : offset + end - self.pos]
            out += piece
            self.pos += len(piece)
        return bytes(out)

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def wheel_url(version: str, index: str) -> str:
    """The URL of one torch wheel of `version` from the registry's JSON API (any platform: the
    headers are the same; the Linux x86_64 CPython 3.11 wheel is preferred)."""
    with urllib.request.urlopen(f"{index}/torch/json", timeout=120) as r:  # the per-version page may be absent
        files = json.load(r)["releases"].get(version, [])
    wheels = [f for f in files if f["filename"].endswith(".whl")]
    if not wheels:
        raise SystemExit(f"gen_stable_api: torch {version}: no wheel on {index}")
    wheels.sort(
        key=lambda f: ("cp311-cp311-manylinux" not in f["filename"] or "x86_64" not in f["filename"], f["size"])
    )
    return str(urllib.parse.urljoin(f"{index}/torch/json", wheels[0]["url"]))


class Release:
    """The torch package of one release: a wheel (local or remote) or an installed directory."""

    def __init__(self, source: str, index: str) -> None:
        self.source = source
        path = Path(source)
        self.dir: Path | None = None
        self.zip: zipfile.ZipFile | None = None
        if path.is_dir():
            self.dir = path
        elif path.is_file():
            self.zip = zipfile.ZipFile(path)
        elif re.fullmatch(r"\d+\.\d+(\.\d+)?", source):
            self.source = wheel_url(source, index)
            self.zip = zipfile.ZipFile(HttpRangeFile(self.source))  # type: ignore[arg-type]
        else:
            raise SystemExit(f"gen_stable_api: --torch {source}: expected a wheel, a torch directory or a version")

    def files(self) -> list[str]:
        """Paths relative to the torch package."""
        if self.zip is not None:
            return [i.filename[len("torch/") :] for i in self.zip.infolist() if i.filename.startswith("torch/")]
        assert self.dir is not None
        return [str(p.relative_to(self.dir)) for p in self.dir.rglob("*") if p.is_file()]

    def text(self, rel: str) -> str:
        if self.zip is not None:
            return self.zip.read("torch/" + rel).decode("utf-8", "replace")
        assert self.dir is not None
        return (self.dir / rel).read_text(encoding="utf-8", errors="replace")

    def version(self) -> str:
        m = re.search(r"__version__\s*=\s*['\"]([^'\"+]+)", self.text("version.py"))
        if not m:
            raise SystemExit(f"gen_stable_api: {self.source}: no __version__ in torch/version.py")
        return m.group(1)


def read_release(release: Release) -> dict:
    """Headers, declarations and the shim version list of one release."""
    files = release.files()
    headers = sorted(f for f in files if f.startswith(PREFIXES) and f.endswith((".h", ".hpp", ".cuh")))
    merged = Declarations()
    for rel in headers:
        found = declarations(release.text(rel))
        for table, more in ((merged.macros, found.macros), (merged.names, found.names), (merged.shim, found.shim)):
            for name, guard in more.items():
                if name not in table or (guard is not None and (table[name] is None or guard < table[name])):  # type: ignore[operator]
                    table[name] = guard
    versions: dict[str, str] = {}
    for rel in VERSIONS_FILE:
        if rel in files:
            for line in release.text(rel).splitlines():
                m = re.match(r"\s*([A-Za-z_]\w*)\b[\s:,=]+v?(\d+\.\d+)", line)
                if m and not line.lstrip().startswith("#"):
                    versions[m.group(1)] = m.group(2)
    return {
        "version": release.version(),
        "headers": [h[len("include/") :] for h in headers],
        "decl": merged,
        "versions": versions,
    }


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _fmt(guard: tuple[int, int] | None) -> str | None:
    return None if guard is None else f"{guard[0]}.{guard[1]}"


def merge(scans: list[dict]) -> dict:
    """since / guard / removed per entry, over the releases oldest first."""
    scans = sorted(scans, key=lambda s: tuple(int(p) for p in s["version"].split(".")))
    tables: dict[str, dict[str, dict]] = {"headers": {}, "macros": {}, "names": {}, "shim": {}}
    for scan in scans:
        minor = _minor(scan["version"])
        present = {
            "headers": dict.fromkeys(scan["headers"]),
            "macros": scan["decl"].macros,
            "names": scan["decl"].names,
            "shim": scan["decl"].shim,
        }
        for kind, entries in present.items():
            table = tables[kind]
            for name, guard in entries.items():
                entry = table.setdefault(name, {"since": minor})
                if kind != "headers":  # the highest guard any release puts it under
                    known = entry.get("guard")
                    if known is None or (guard is not None and guard > tuple(int(p) for p in known.split("."))):
                        entry["guard"] = _fmt(guard)
                entry.pop("removed", None)
            for name, entry in table.items():
                if name not in entries and "removed" not in entry:
                    entry["removed"] = minor
    listed = {name: v for scan in scans for name, v in scan["versions"].items()}
    return {
        "schema": "keel-audit-stable-api/1",
        "generator": "audit/scripts/gen_stable_api.py",
        "generated": datetime.date.today().isoformat(),
        "torch": [s["version"] for s in scans],
        "shim_function_versions": {
            "releases": [s["version"] for s in scans if s["versions"]],
            "functions": dict(sorted(listed.items())),
        },
        **{kind: dict(sorted(table.items())) for kind, table in tables.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", nargs="+", required=True, help="torch wheels, torch directories or versions")
    parser.add_argument("--index", default=PYPI, help="the registry's JSON API (for versions)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    scans = []
    for source in args.torch:
        release = Release(source, args.index)
        scans.append(read_release(release))
        fetched = getattr(release.zip.fp, "requests", None) if release.zip else None  # type: ignore[union-attr]
        note = f" ({fetched} range requests)" if fetched else ""
        print(
            f"torch {scans[-1]['version']}: {len(scans[-1]['headers'])} headers from {release.source}{note}",
            file=sys.stderr,
        )
    table = merge(scans)
    args.out.write_text(json.dumps(table, indent=0, sort_keys=False) + "\n")
    counts = ", ".join(f"{len(table[k])} {k}" for k in ("headers", "macros", "names", "shim"))
    print(f"{args.out}: {counts} from torch {', '.join(table['torch'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
