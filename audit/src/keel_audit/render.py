"""The readable table, drawn from the JSON document (schema `keel-audit/2`, result.py).

It reads only the document, so the table never shows what `--json` lacks, and a saved document
renders the same table.
"""

from __future__ import annotations

from typing import Any

from .mangling import demangle
from .policy import SEVERITIES

SHOW = 5  # offending symbols shown per library/finding in the table
_RESULT = {0: "PASS", 1: "FAIL (gate failed)", 2: "ERROR (could not audit)"}
_HEADER = (
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
)


def _sym(name: str, width: int = 160) -> str:
    text = demangle(name)
    return text if len(text) <= width else text[: width - 3] + "..."


def _cell(value: object) -> str:
    return "-" if value is None or value == "" else str(value)


def _offending(lib: dict[str, Any]) -> list[str]:
    """Unstable references (imports, then compiled-in layouts) and unknown shim symbols."""
    return [u["name"] for u in lib["unstable_symbols"]] + list(lib["unknown_shim"])


def _row(lib: dict[str, Any]) -> list[str]:
    verdict = lib["verdict"] + (" (allowed)" if lib["allowed"] else "")
    return [
        lib["path"],
        verdict,
        _cell(lib["torch_floor"]),
        _cell(lib["python_floor"]),
        _cell(lib["glibc_max"]),
        _cell(lib["manylinux_floor"]),
        str(len(lib["shim_symbols"])),
        str(len(_offending(lib))),
        str(len(lib["header_only_exported"]) + len(lib["header_only_imported"])),
        str(lib["cpython_limited"] + len(lib["cpython_nonlimited"])),
        str(lib["other"]),
    ]


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def render_table(doc: dict[str, Any]) -> str:
    """Per library: verdict, floors, counts; then findings with the first offending symbols demangled."""
    lines = [f"keel audit: {', '.join(doc['sources'])}"]
    if doc["tags"]:
        lines.append(f"wheel tags: {', '.join(doc['tags'])}")
    libraries = doc["libraries"]
    lines += _table([list(_HEADER)] + [_row(lib) for lib in libraries]) if libraries else ["(no ELF objects)"]
    for lib in libraries:
        if lib["error"]:
            lines.append(f"  {lib['path']}: {lib['error']}")
        for name in _offending(lib)[:SHOW]:
            lines.append(f"  {lib['path']}: {_sym(name)}")
        if lib["floor_symbols"] and lib["torch_floor"]:
            shown = ", ".join(lib["floor_symbols"][:SHOW])
            lines.append(f"  {lib['path']}: torch {lib['torch_floor']} needed by {shown}")
    gates = [f"policy {doc['policy']}"]
    if doc["target_torch"]:
        gates.append(f"--target-torch {doc['target_torch']}")
    gates += [f"--allow {p}" for p in doc["allow"]]
    lines.append("")
    lines.append(
        f"package: {doc['verdict']}  torch>={_cell(doc['torch_floor'])}  "
        f"python>={_cell(doc['python_floor'])}  glibc {_cell(doc['glibc_max'])}  "
        f"manylinux {_cell(doc['manylinux_floor'])}  "
        f"gates: {' '.join(gates)}"
    )
    for f in sorted(doc["findings"], key=lambda f: SEVERITIES.index(f["severity"])):
        where = f" {f['library']}" if f["library"] else ""
        lines.append(f"{f['severity'].upper()} [{f['code']}]{where}: {f['message']}")
        for name in f["symbols"][:SHOW]:
            lines.append(f"      {_sym(name)}")
        if len(f["symbols"]) > SHOW:
            lines.append(f"      ... and {len(f['symbols']) - SHOW} more")
    counts = ", ".join(f"{n} {s}{'s' if n != 1 else ''}" for s, n in ((s, doc["counts"][s]) for s in SEVERITIES))
    lines.append(f"result: {_RESULT[doc['exit_code']]}; torch floor {_cell(doc['torch_floor'])}; {counts}")
    return "\n".join(lines)
