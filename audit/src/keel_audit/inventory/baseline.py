"""A baseline for ratcheting a migration: the findings a project accepts for now, counted per file
and construct (not per line, so edits elsewhere in a file do not make old findings new)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from ..errors import AuditInputError
from .project import Project
from .scan import Finding

SCHEMA = "keel-audit-inventory-baseline/1"
MAX_BYTES = 64 << 20


def _key(path: str, f: Finding) -> tuple[str, str, str]:
    return path, f.rule.key, f.what


def write(projects: list[Project], path: Path) -> None:
    """Record every finding of `projects` as accepted."""
    counts = Counter(_key(p, f) for project in projects for p, f in project.findings)
    entries = [{"path": k[0], "rule": k[1], "what": k[2], "count": n} for k, n in sorted(counts.items())]
    path.write_text(json.dumps({"schema": SCHEMA, "accepted": entries}, indent=1) + "\n", encoding="utf-8")


def read(path: Path) -> Counter[tuple[str, str, str]]:
    """The accepted counts of a baseline file (exit 2 naming the file when it is not one)."""
    try:
        if path.stat().st_size > MAX_BYTES:
            raise AuditInputError(f"--baseline {path}: over {MAX_BYTES >> 20} MiB; expected a baseline file")
        doc: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise AuditInputError(f"--baseline {path}: cannot read it as JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("accepted"), list):
        raise AuditInputError(f"--baseline {path}: expected a {SCHEMA} document (written by --write-baseline)")
    counts: Counter[tuple[str, str, str]] = Counter()
    for entry in doc["accepted"]:
        try:
            counts[(str(entry["path"]), str(entry["rule"]), str(entry["what"]))] += int(entry["count"])
        except (KeyError, TypeError, ValueError) as exc:
            raise AuditInputError(f"--baseline {path}: entry {entry!r} lacks path, rule, what or count") from exc
    return counts


def new_findings(projects: list[Project], accepted: Counter[tuple[str, str, str]]) -> dict[int, bool]:
    """For each finding (by id): True when it is beyond what the baseline accepts for its file and
    construct (the first ones in source order count as the accepted ones)."""
    left = Counter(accepted)
    out: dict[int, bool] = {}
    for project in projects:
        for path, f in project.findings:
            key = _key(path, f)
            out[id(f)] = left[key] <= 0
            left[key] -= 1
    return out
