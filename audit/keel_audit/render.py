"""Render a PackageAudit as a readable table or as the versioned JSON document."""

from __future__ import annotations

from dataclasses import asdict

from .mangling import demangle
from .models import SCHEMA, LibraryAudit, PackageAudit

SHOW = 5  # offending symbols shown per library/finding in the table
_RESULT = {0: "PASS", 1: "FAIL (gate failed)", 2: "ERROR (could not audit)"}
_ORDER = ("error", "warning", "note")


def _sym(name: str, width: int = 160) -> str:
    text = demangle(name)
    return text if len(text) <= width else text[: width - 3] + "..."


def _cell(value: object) -> str:
    return "-" if value in (None, "", ()) else str(value)


def _row(lib: LibraryAudit) -> list[str]:
    verdict = lib.verdict + (" (allowed)" if lib.allowed else "")
    return [
        lib.path,
        verdict,
        _cell(lib.torch_floor),
        _cell(lib.python_floor),
        _cell(lib.glibc_max),
        _cell(lib.manylinux_floor),
        str(len(lib.shim_symbols)),
        str(len(lib.unstable_symbols) + len(lib.unknown_shim)),
        str(len(lib.header_only_exported) + len(lib.header_only_imported)),
        str(lib.cpython_limited + len(lib.cpython_nonlimited)),
        str(lib.other),
    ]


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def render_table(result: PackageAudit) -> str:
    """Per library: verdict, floors, counts; then findings with the first offending symbols demangled."""
    lines = [f"keel audit: {', '.join(result.sources)}"]
    if result.tags:
        lines.append(f"wheel tags: {', '.join(result.tags)}")
    header = [
        "library",
        "verdict",
        "torch>=",
        "python>=",
        "glibc",
        "manylinux",
        "shim",
        "unstable",
        "header-only",
        "cpython",
        "other",
    ]
    lines += _table([header] + [_row(lib) for lib in result.libraries]) if result.libraries else ["(no ELF objects)"]
    for lib in result.libraries:
        if lib.error:
            lines.append(f"  {lib.path}: {lib.error}")
        for name in (lib.unstable_symbols + lib.unknown_shim)[:SHOW]:
            lines.append(f"  {lib.path}: {_sym(name)}")
        if lib.floor_symbols and lib.torch_floor:
            shown = ", ".join(lib.floor_symbols[:SHOW])
            lines.append(f"  {lib.path}: torch {lib.torch_floor} needed by {shown}")
    gates = [f"policy {result.policy}"]
    if result.target_torch:
        gates.append(f"--target-torch {result.target_torch}")
    gates += [f"--allow {p}" for p in result.allow]
    lines.append("")
    lines.append(
        f"package: {result.verdict}  torch>={_cell(result.torch_floor)}  "
        f"python>={_cell(result.python_floor)}  glibc {_cell(result.glibc_max)}  "
        f"manylinux {_cell(result.manylinux_floor)}  "
        f"gates: {' '.join(gates)}"
    )
    for f in sorted(result.findings, key=lambda f: _ORDER.index(f.severity)):
        where = f" {f.library}" if f.library else ""
        lines.append(f"{f.severity.upper()} [{f.code}]{where}: {f.message}")
        for name in f.symbols[:SHOW]:
            lines.append(f"      {_sym(name)}")
        if len(f.symbols) > SHOW:
            lines.append(f"      ... and {len(f.symbols) - SHOW} more")
    counts = ", ".join(f"{result.count(s)} {s}{'s' if result.count(s) != 1 else ''}" for s in _ORDER)
    lines.append(f"result: {_RESULT[result.exit_code]}; torch floor {_cell(result.torch_floor)}; {counts}")
    return "\n".join(lines)


def to_json(result: PackageAudit) -> dict:
    """Schema `keel-audit/2`: package verdicts first, then libraries and findings (with severities)."""
    libraries = []
    for lib in result.libraries:
        doc = asdict(lib)
        doc["shim_symbols"] = dict(lib.shim_symbols)
        doc["unstable_symbols"] = [{"name": n, "demangled": demangle(n)} for n in lib.unstable_symbols]
        libraries.append(doc)
    return {
        "schema": SCHEMA,
        "passed": bool(result),
        "exit_code": result.exit_code,
        "verdict": result.verdict,
        "torch_floor": result.torch_floor,
        "python_floor": result.python_floor,
        "glibc_max": result.glibc_max,
        "manylinux_floor": result.manylinux_floor,
        "target_torch": result.target_torch,
        "policy": result.policy,
        "counts": {s: result.count(s) for s in _ORDER},
        "requires_python": result.requires_python,
        "allow": list(result.allow),
        "sources": list(result.sources),
        "tags": list(result.tags),
        "findings": [{**asdict(f), "fatal": f.fatal} for f in result.findings],
        "libraries": libraries,
    }
