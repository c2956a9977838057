"""Rebuild audit/src/keel_audit/data/torch_shim_symbols.json from torch releases (wheels or installations).

Per stable C shim symbol: the first torch release whose libtorch_cpu.so / libtorch_cuda.so exports
it (in the oldest release read, its `TORCH_FEATURE_VERSION` guard in the shim headers, 2.9 when
unguarded, since it may be older), and the torch library exporting it. Per header-only torch C++
name (declared in torch/headeronly and re-exported into torch::headeronly): the first release
whose headers have it. Every disagreement between headers and exports is recorded in the table.

Each --torch is a torch package directory or a torch wheel, read straight from the zip (nothing is
installed or extracted), e.g. with the releases downloaded once outside the repository:

    for v in 2.10.0 2.11.0 2.12.1 2.13.0 2.14.1 2.15.0; do
      PIP_CONSTRAINT=/dev/null pip download --no-deps --only-binary :all: torch==$v -d /work/cache/torch-wheels
    done
    python audit/scripts/gen_shim_table.py --torch /work/cache/torch-wheels/torch-*.whl
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import re
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

from keel_audit.elf import ElfInfo, read_elf
from keel_audit.symbol_tables import is_cpython_name, is_shim_name
from keel_audit.wheelzip import read_member

ROOT = Path(__file__).resolve().parents[1]  # audit/
BASELINE = "2.9"
_GUARD = re.compile(r"TORCH_FEATURE_VERSION\s*>=\s*TORCH_VERSION_(\d+)_(\d+)_\d+")
_DECL = re.compile(r"AOTI_TORCH_EXPORT\b[^;{}()]*?\b(\w+)\s*\(")
_HEADERS = (
    "include/torch/csrc/stable/c/*.h",
    "include/torch/csrc/inductor/aoti_torch/c/*.h",
    "include/torch/csrc/inductor/aoti_torch/generated/c_shim_*.h",
)
_HEADER_ONLY = "include/torch/headeronly/*"
_REEXPORT = re.compile(r"\busing\s+(c10::[\w:]+)")
_NS_OPEN = re.compile(r"^\s*namespace\s*([\w:]*)\s*\{")
_NOT_NAMES = frozenset({"operator", "if", "return", "float", "double", "int", "bool", "char", "void", "half"})
_HIDDEN_NS = re.compile(r"HIDDEN_NAMESPACE_BEGIN\(([^)]*)\)")
_TYPE = re.compile(
    r"^\s*(?:template\s*<.*>\s*)?(?:struct|class|union|enum(?:\s+class)?)\s+"
    r"(?:alignas\(\w+\)\s+)?(?:C10_\w+\s+)*(\w+)\s*(?:[:{]|$|final)"
)
_FUNC = re.compile(r"^\s*(?:C10_\w+\s+)*(?:inline|constexpr|static)\b[^;(=]*?\b(\w+)\s*\(")
_ALIAS = re.compile(r"^\s*using\s+(\w+)\s*=")


class TorchRelease:
    """One torch release to read: an installed package directory or a wheel (read from the zip)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.zip = zipfile.ZipFile(path) if path.is_file() else None
        self.names = {i.filename[len("torch/") :]: i for i in self.zip.infolist()} if self.zip else {}

    def text(self, rel: str) -> str | None:
        """A file of the torch package (relative to torch/) as text, or None."""
        if self.zip is not None:
            info = self.names.get(rel)
            return self.zip.read(info).decode("utf-8", "replace") if info else None
        path = self.path / rel
        return path.read_text(errors="replace") if path.is_file() else None

    def glob(self, pattern: str) -> Iterator[str]:
        """Files (relative to torch/) matching a glob; `*` also crosses directories."""
        names = (
            self.names
            if self.zip is not None
            else (str(p.relative_to(self.path)) for p in self.path.rglob("*") if p.is_file())
        )
        return iter(sorted(n for n in names if fnmatch.fnmatch(n, pattern)))

    def library(self, name: str) -> ElfInfo | None:
        """torch/lib/<name> read as ELF (streamed from the wheel without extracting it)."""
        if self.zip is not None:
            info = self.names.get(f"lib/{name}")
            return read_elf(read_member(self.zip, info)) if info else None
        path = self.path / "lib" / name
        return read_elf(path) if path.exists() else None


def torch_version(release: TorchRelease) -> str:
    """The `__version__` of a torch release, read from version.py without importing torch."""
    match = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", release.text("version.py") or "")
    if not match:
        raise SystemExit(f"gen_shim_table: {release.path}: expected torch/version.py with __version__ = '...'")
    return match.group(1).split("+")[0]


def _code_lines(text: str) -> Iterator[str]:
    """Lines of C++ code: comments, string literals and preprocessor lines (continuations too) removed."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    macro = False
    for raw in text.splitlines():
        line = raw.split("//")[0]
        if macro or line.lstrip().startswith("#"):
            macro = line.rstrip().endswith("\\")
            continue
        yield re.sub(r'"(?:\\.|[^"\\])*"', '""', line)


def header_only_names(text: str) -> set[str]:
    """Qualified c10 names a torch/headeronly header declares at namespace scope (types, aliases,
    functions) or re-exports into torch::headeronly (`using c10::X;`)."""
    # an operator is decided by the types around it (keel_audit.classify), never by the name alone
    out = {m.group(1) for m in _REEXPORT.finditer(text) if not m.group(1).endswith("::operator")}
    stack: list[str | None] = []  # namespace name, or None for any other brace
    for line in _code_lines(text):
        hidden = _HIDDEN_NS.search(line)
        if hidden:
            stack.append("::".join(a.strip() for a in hidden.group(1).split(",")))
            continue
        if "HIDDEN_NAMESPACE_END" in line:
            if stack:
                stack.pop()
            continue
        at_namespace_scope = all(p is not None for p in stack)
        ns = "::".join(p for p in stack if p)
        if at_namespace_scope and ns.startswith("c10") and "" not in stack:  # anonymous: TU-local
            for pattern in (_TYPE, _FUNC, _ALIAS):
                m = pattern.match(line)
                if m and m.group(1) not in _NOT_NAMES:
                    out.add(f"{ns}::{m.group(1)}")
        opened = _NS_OPEN.match(line)
        rest = line[opened.end() :] if opened else line
        if opened:
            stack.append(opened.group(1))
        for ch in rest:
            if ch == "{":
                stack.append(None)
            elif ch == "}" and stack:
                stack.pop()
    return out


def header_symbols(text: str) -> dict[str, str]:
    """Declared shim functions of one header's text -> the version of their innermost guard (or 2.9)."""
    stack: list[str | None] = []
    out: dict[str, str] = {}
    pending = ""
    for raw in text.splitlines():
        line = raw.split("//")[0].strip()
        if line.startswith("#"):
            word = line[1:].strip().split(" ")[0]
            if word in ("if", "ifdef", "ifndef"):
                m = _GUARD.search(line)
                stack.append(f"{m.group(1)}.{m.group(2)}" if m else None)
            elif word in ("else", "elif") and stack:
                stack[-1] = None
            elif word == "endif" and stack:
                stack.pop()
            continue
        pending = (pending + " " + line) if pending or "AOTI_TORCH_EXPORT" in line else ""
        if pending and "(" in pending:
            m = _DECL.search(pending)
            if m:
                guards = [g for g in stack if g]
                out[m.group(1)] = max(guards, key=_vkey) if guards else BASELINE
            pending = ""
    return out


def _vkey(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


def scan(release: TorchRelease) -> dict:
    """Headers, exports, header-only names and libtorch_python globals of one torch release."""
    declared: dict[str, str] = {}
    for pattern in _HEADERS:
        for header in release.glob(pattern):
            declared.update(header_symbols(release.text(header) or ""))
    exported: dict[str, str] = {}
    libs = {}
    for lib in ("libtorch_cpu.so", "libtorch_cuda.so"):
        libs[lib] = release.library(lib)
        for name in libs[lib].defined_names if libs[lib] else ():
            if is_shim_name(name):
                exported.setdefault(name, lib)
    header_only: set[str] = set()
    for header in release.glob(_HEADER_ONLY):
        if header.endswith(".h"):
            header_only |= header_only_names(release.text(header) or "")
    globals_: set[str] = set()
    python = release.library("libtorch_python.so")
    for name in python.defined_names if python else ():
        if not name.startswith(("_Z", "PyInit_", "_edata", "_end", "__bss")) and not is_cpython_name(name):
            globals_.add(name)
    return {
        "version": torch_version(release),
        "declared": declared,
        "exported": exported,
        "header_only": header_only,
        "python_globals": globals_,
        "has_cuda": libs["libtorch_cuda.so"] is not None,
    }


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def merge(scans: list[dict]) -> dict:
    """Union several scans (oldest first): a symbol's version is the first release exporting it."""
    scans = sorted(scans, key=lambda s: _vkey(s["version"]))
    oldest = scans[0]["version"]
    symbols: dict[str, dict] = {}
    disagreements: list[dict] = []

    def note(name: str, version: str, kind: str, detail: str) -> None:
        disagreements.append({"symbol": name, "torch": version, "kind": kind, "detail": detail})

    for scan in scans:
        version, tv = scan["version"], _minor(scan["version"])
        for name, lib in scan["exported"].items():
            entry = symbols.setdefault(name, {"sources": []})
            entry["sources"].append(f"{lib}@{version}")
            entry["library"] = lib
            if "since" not in entry or "exported" not in entry:
                guard = scan["declared"].get(name)
                if version == oldest and guard is not None:
                    entry["since"] = min(guard, tv, key=_vkey)  # may be older than the oldest release read
                else:
                    entry["since"] = tv
                    if guard is not None and _vkey(guard) != _vkey(tv):
                        note(name, version, "guard-differs", f"header guard {guard}, first exported in {tv}")
                entry["exported"] = True
            if name not in scan["declared"]:
                note(name, version, "exported-not-declared", f"exported by {lib}, in no shim header")
        for name, guard in scan["declared"].items():
            entry = symbols.setdefault(name, {"sources": []})
            entry["sources"].append(f"header@{version}")
            if "since" not in entry:
                entry["since"] = guard  # declared, not (yet) exported: the guard is all there is
            if (
                name not in scan["exported"]
                and not name.startswith(("aoti_torch_mps", "aoti_torch_xpu"))
                and (scan["has_cuda"] or "cuda" not in name)
            ):
                note(
                    name, version, "declared-not-exported", "in the headers, not exported by libtorch_cpu/libtorch_cuda"
                )
    for entry in symbols.values():
        entry.pop("exported", None)
    header_only: dict[str, str] = {}
    for scan in scans:
        for name in sorted(scan["header_only"]):
            header_only.setdefault(name, _minor(scan["version"]))
    python_globals = sorted(set().union(*(s["python_globals"] for s in scans)))
    return {
        "schema": 1,
        "generator": "scripts/gen_shim_table.py",
        "generated": datetime.date.today().isoformat(),
        "torch_versions": [s["version"] for s in scans],
        "baseline": BASELINE,
        "symbols": {k: symbols[k] for k in sorted(symbols)},
        "header_only": dict(sorted(header_only.items())),
        "python_globals": python_globals,
        "disagreements": disagreements,
    }


def cpython_table() -> dict:
    """CPython limited-API symbols with the version that added each, taken from abi3info."""
    import abi3info  # generator-only dependency (comes with torch-abi-audit)

    symbols = {}
    for table in (abi3info.FUNCTIONS, abi3info.DATAS):
        for sym, entry in table.items():
            symbols[sym.name] = f"{entry.added.major}.{entry.added.minor}"
    return {
        "schema": 1,
        "generator": "scripts/gen_shim_table.py --cpython-out",
        "source": "abi3info",
        "symbols": dict(sorted(symbols.items())),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--torch",
        nargs="+",
        action="extend",
        type=Path,
        required=True,
        help="torch package directories or torch wheels",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "keel_audit/data/torch_shim_symbols.json")
    parser.add_argument("--cpython-out", type=Path, help="also write the CPython limited-API table here")
    args = parser.parse_args(argv)
    scans = []
    for path in args.torch:
        scans.append(scan(TorchRelease(path.resolve())))
        print(f"read torch {scans[-1]['version']} from {path}", file=sys.stderr)
    table = merge(scans)
    args.out.write_text(json.dumps(table, indent=1) + "\n")
    kinds: dict[str, int] = {}
    for d in table["disagreements"]:
        kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
    print(
        f"{args.out}: {len(table['symbols'])} symbols, {len(table['header_only'])} header-only names "
        f"from torch {', '.join(table['torch_versions'])}; "
        f"disagreements {kinds}"
    )
    if args.cpython_out:
        args.cpython_out.write_text(json.dumps(cpython_table(), indent=1) + "\n")
        print(f"{args.cpython_out}: written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
