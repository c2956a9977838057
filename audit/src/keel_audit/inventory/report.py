"""The inventory as a versioned JSON document (keel-audit-inventory/1), as a table drawn from that
document, and as SARIF 2.1.0 for GitHub code scanning."""

from __future__ import annotations

import hashlib
from typing import Any

from .knowledge import Knowledge, fmt
from .project import Project
from .scan import Finding

SCHEMA = "keel-audit-inventory/1"
SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
_STATUS_TEXT = {
    "stable": "replace with {replacement}",
    "dispatcher": "no stable equivalent: call the op through the dispatcher (torch_call_dispatcher)",
    "none": "none yet",
}


def advice(f: Finding) -> str:
    """One line: what to do about a finding."""
    rule = f.rule
    text = _STATUS_TEXT[rule.status].format(replacement=rule.replacement)
    if rule.status == "none" and rule.hint:
        return f"none yet: {rule.hint}" if not rule.hint.startswith(("no stable", "none yet")) else rule.hint
    if rule.hint:
        text += f" ({rule.hint})"
    return text


def _finding(project: Project, path: str, f: Finding, new: bool | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "project": project.label,
        "path": path,
        "line": f.line,
        "column": f.col,
        "kind": f.kind,
        "what": f.what,
        "rule": f.rule.key,
        "status": f.rule.status,
        "replacement": f.rule.replacement,
        "since": fmt(f.rule.since),
        "torch_target_version": fmt(f.rule.target),
        "advice": advice(f),
        "mechanical": f.rule.fix is not None or f.rule.dispatch_v2 is not None,
    }
    if new is not None:
        out["new"] = new
    return out


def document(projects: list[Project], know: Knowledge, new: dict[int, bool] | None = None) -> dict[str, Any]:
    """The keel-audit-inventory/1 document. `new` marks findings (by id) absent from a baseline."""
    findings = [
        _finding(p, path, f, None if new is None else new.get(id(f), True)) for p in projects for path, f in p.findings
    ]
    counted = [f for f in findings if f.get("new", True)]
    return {
        "schema": SCHEMA,
        "stable_api": {"torch": know.stable_doc["torch"], "generated": know.stable_doc["generated"]},
        "projects": [
            {
                "input": p.label,
                "files_scanned": len(p.files),
                "files_named": sum(r.named for r in p.files.values()),
                "third_party_left_out": p.third_party,
                "findings": len(p.findings),
                "torch_target_version": fmt(p.target),
                "build_torch": fmt(p.build),
                "files": [
                    {
                        "path": p.prefix + path,
                        "named": r.named,
                        "findings": len(r.findings),
                        "torch_target_version": fmt(r.target),
                        "build_torch": fmt(r.build),
                        "stable_uses": sorted(r.scan.uses),
                    }
                    for path, r in sorted(p.files.items())
                ],
            }
            for p in projects
        ],
        "findings": findings,
        "summary": {
            "findings": len(findings),
            "new": len(counted) if new is not None else None,
            "by_status": {s: sum(f["status"] == s for f in findings) for s in ("stable", "dispatcher", "none")},
        },
        "exit_code": 1 if counted else 0,
    }


def table(doc: dict[str, Any]) -> str:
    """The human-readable report: one line per finding, then per project and per file floors."""
    lines: list[str] = []
    for f in doc["findings"]:
        if not f.get("new", True):
            continue
        since = f" [torch {f['since']}]" if f["since"] else ""
        fix = " (mechanical: --fix)" if f["mechanical"] else ""
        lines.append(f"{f['path']}:{f['line']}:{f['column']}: {f['what']}: {f['advice']}{since}{fix}")
    for p in doc["projects"]:
        unstable = [x for x in p["files"] if x["findings"]]
        lines.append("")
        lines.append(
            f"{p['input']}: {p['findings']} unstable use(s) in {len(unstable)} of {p['files_scanned']} file(s); "
            f"the migrated source needs TORCH_TARGET_VERSION {p['torch_target_version'] or '-'} "
            f"(headers of torch >= {p['build_torch'] or '-'})"
        )
        if p["third_party_left_out"]:
            shown = ", ".join(p["third_party_left_out"][:8]) + (" ..." if len(p["third_party_left_out"]) > 8 else "")
            lines.append(f"  third-party folders left out (--include-third-party reads them): {shown}")
        for x in unstable:
            lines.append(f"  {x['path']}: {x['findings']} finding(s), TORCH_TARGET_VERSION {x['torch_target_version']}")
    s = doc["summary"]
    new = f", {s['new']} new against the baseline" if s.get("new") is not None else ""
    lines.append(f"result: {s['findings']} unstable use(s){new}; exit {doc['exit_code']}")
    return "\n".join(lines)


def sarif(doc: dict[str, Any], version: str) -> dict[str, Any]:
    """SARIF 2.1.0: one rule per construct, one result per finding (new findings only, when a
    baseline was given), paths relative to the scanned root."""
    rules: dict[str, dict[str, Any]] = {}
    results = []
    for f in doc["findings"]:
        if not f.get("new", True):
            continue
        rule_id = f"stable-abi/{f['kind']}/{f['rule']}"
        if rule_id not in rules:
            rules[rule_id] = {
                "id": rule_id,
                "name": f"Unstable{f['kind'].capitalize()}",
                "shortDescription": {"text": f"unstable libtorch API: {f['rule']}"},
                "fullDescription": {"text": f["advice"]},
                "help": {
                    "text": f"{f['advice']}; first torch release with the replacement: {f['since'] or 'none yet'}"
                },
                "defaultConfiguration": {"level": "warning"},
                "properties": {"tags": ["libtorch-stable-abi"], "status": f["status"]},
            }
        fingerprint = hashlib.sha256(f"{f['path']}|{f['what']}|{f['rule']}".encode()).hexdigest()[:32]
        results.append(
            {
                "ruleId": rule_id,
                "ruleIndex": list(rules).index(rule_id),
                "level": "warning",
                "message": {"text": f"{f['what']}: {f['advice']}"},
                "locations": [
                    {
                        "physicalLocation": {
                            "artifactLocation": {"uri": f["path"]},
                            "region": {"startLine": f["line"], "startColumn": f["column"]},
                        }
                    }
                ],
                "partialFingerprints": {"keelInventory/v1": fingerprint},
                "properties": {"since": f["since"], "torchTargetVersion": f["torch_target_version"]},
            }
        )
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "keel-audit inventory",
                        "version": version,
                        "informationUri": "https://pypi.org/project/keel-audit/",
                        "rules": list(rules.values()),
                    }
                },
                "columnKind": "unicodeCodePoints",
                "results": results,
            }
        ],
    }
