"""Rebuild keel/audit/data/torch_shim_symbols.json from one or more torch installations.

A symbol's version is its `TORCH_FEATURE_VERSION` guard in the stable/AOTI shim headers (2.9 when
unguarded), unioned with the C shim symbols libtorch_cpu.so / libtorch_cuda.so export; every
disagreement between headers and exports (or between torch versions) is recorded in the table.

    python scripts/gen_shim_table.py --torch .venv/lib/python3.11/site-packages/torch \
        --torch .venv-214/lib/python3.11/site-packages/torch [--cpython-out ...]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "2.9"
_GUARD = re.compile(r"TORCH_FEATURE_VERSION\s*>=\s*TORCH_VERSION_(\d+)_(\d+)_\d+")
_DECL = re.compile(r"AOTI_TORCH_EXPORT\b[^;{}()]*?\b(\w+)\s*\(")
_HEADERS = (
    "include/torch/csrc/stable/c/*.h",
    "include/torch/csrc/inductor/aoti_torch/c/*.h",
    "include/torch/csrc/inductor/aoti_torch/generated/c_shim_*.h",
)


def _load_audit():
    """Load keel/audit by file path, exactly as setup.py does (no `import keel`)."""
    spec = importlib.util.spec_from_file_location(
        "_keel_audit", ROOT / "keel/audit/__init__.py", submodule_search_locations=[str(ROOT / "keel/audit")]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["_keel_audit"] = module
    spec.loader.exec_module(module)
    return module


def torch_version(root: Path) -> str:
    """The `__version__` of a torch install, read from version.py without importing torch."""
    match = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", (root / "version.py").read_text())
    if not match:
        raise SystemExit(f"gen_shim_table: {root}/version.py: expected __version__ = '...'")
    return match.group(1).split("+")[0]


def header_symbols(path: Path) -> dict[str, str]:
    """Declared shim functions of one header -> the version of their innermost guard (or 2.9)."""
    stack: list[str | None] = []
    out: dict[str, str] = {}
    pending = ""
    for raw in path.read_text().splitlines():
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


def scan_root(root: Path, audit) -> dict:
    """Headers, exports and libtorch_python globals of one torch installation."""
    declared: dict[str, str] = {}
    for pattern in _HEADERS:
        for header in sorted(root.glob(pattern)):
            declared.update(header_symbols(header))
    exported: dict[str, str] = {}
    for lib in ("libtorch_cpu.so", "libtorch_cuda.so"):
        path = root / "lib" / lib
        if path.exists():
            for sym in audit.elf.read_elf(path).defined:
                if audit.table.is_shim_name(sym.name):
                    exported.setdefault(sym.name, lib)
    globals_: set[str] = set()
    python = root / "lib" / "libtorch_python.so"
    if python.exists():
        for sym in audit.elf.read_elf(python).defined:
            name = sym.name
            if not name.startswith(
                ("_Z", "PyInit_", "_edata", "_end", "__bss")
            ) and not audit.table.is_cpython_name(name):
                globals_.add(name)
    return {
        "version": torch_version(root),
        "declared": declared,
        "exported": exported,
        "python_globals": globals_,
        "has_cuda": (root / "lib" / "libtorch_cuda.so").exists(),
    }


def merge(scans: list[dict]) -> dict:
    """Union several scans: header version wins, export-only symbols get the first torch exporting them."""
    scans = sorted(scans, key=lambda s: _vkey(s["version"]))
    symbols: dict[str, dict] = {}
    disagreements: list[dict] = []
    for scan in scans:
        tv = ".".join(scan["version"].split(".")[:2])
        for name, since in scan["declared"].items():
            entry = symbols.setdefault(name, {"since": since, "sources": []})
            if _vkey(since) != _vkey(entry["since"]) and "header" in " ".join(entry["sources"]):
                disagreements.append(
                    {
                        "symbol": name,
                        "torch": scan["version"],
                        "kind": "guard-changed",
                        "detail": f"guard {entry['since']} -> {since}; keeping the higher",
                    }
                )
                entry["since"] = max(since, entry["since"], key=_vkey)
            elif "header" not in " ".join(entry["sources"]):
                entry["since"] = since if not entry["sources"] else min(since, entry["since"], key=_vkey)
            entry["sources"].append(f"header@{scan['version']}")
            lib = scan["exported"].get(name)
            if lib:
                entry["sources"].append(f"{lib}@{scan['version']}")
            elif not name.startswith(("aoti_torch_mps", "aoti_torch_xpu")) and (
                scan["has_cuda"] or "cuda" not in name
            ):
                disagreements.append(
                    {
                        "symbol": name,
                        "torch": scan["version"],
                        "kind": "declared-not-exported",
                        "detail": "in the headers, not exported by libtorch_cpu/libtorch_cuda",
                    }
                )
        for name, lib in scan["exported"].items():
            if name not in scan["declared"]:
                entry = symbols.setdefault(name, {"since": tv, "sources": []})
                entry["sources"].append(f"{lib}@{scan['version']}")
                disagreements.append(
                    {
                        "symbol": name,
                        "torch": scan["version"],
                        "kind": "exported-not-declared",
                        "detail": f"exported by {lib}, in no shim header; floor set to {entry['since']}",
                    }
                )
    python_globals = sorted(set().union(*(s["python_globals"] for s in scans)))
    return {
        "schema": 1,
        "generator": "scripts/gen_shim_table.py",
        "generated": datetime.date.today().isoformat(),
        "torch_versions": [s["version"] for s in scans],
        "baseline": BASELINE,
        "symbols": {k: symbols[k] for k in sorted(symbols)},
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
        "--torch", action="append", type=Path, required=True, help="a torch package directory"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "keel/audit/data/torch_shim_symbols.json")
    parser.add_argument("--cpython-out", type=Path, help="also write the CPython limited-API table here")
    args = parser.parse_args(argv)
    audit = _load_audit()
    scans = [scan_root(root.resolve(), audit) for root in args.torch]
    table = merge(scans)
    args.out.write_text(json.dumps(table, indent=1) + "\n")
    kinds: dict[str, int] = {}
    for d in table["disagreements"]:
        kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
    print(
        f"{args.out}: {len(table['symbols'])} symbols from torch {', '.join(table['torch_versions'])}; "
        f"disagreements {kinds}"
    )
    if args.cpython_out:
        args.cpython_out.write_text(json.dumps(cpython_table(), indent=1) + "\n")
        print(f"{args.cpython_out}: written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
