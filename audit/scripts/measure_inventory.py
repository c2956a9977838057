"""Measure keel-audit inventory on real sdists (docs/measurements/2026-12-07-inventory.md).

For each sdist: the findings by folder; the recall of vLLM's regex pre-commit hook's patterns
(tools/pre_commit/check_stable_abi.py: its unstable include prefixes and seven code patterns,
re-implemented here and applied outside comments and strings, on the same files): every hit must
be a finding of the inventory on that line; a seeded random sample of findings for reading by hand;
and the inventory's wall time as a user runs it (a fresh process, best of N): a whole folder and one
file (with the headers it includes).

    python audit/scripts/measure_inventory.py .cache/inventory/vllm-0.34.0.tar.gz \
        .cache/inventory/flash_attn-2.8.3.post2.tar.gz --sample 100 --seed 7 --out /tmp/inventory-measure
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path

from keel_audit.inventory.knowledge import knowledge
from keel_audit.inventory.lexer import mask
from keel_audit.inventory.project import Project, analyse
from keel_audit.inventory.sources import Tree

# vLLM's hook (tools/pre_commit/check_stable_abi.py), its patterns as data
HOOK_ALLOWED = ("torch/csrc/stable/", "torch/headeronly/", "torch/csrc/inductor/aoti_torch/")
HOOK_PREFIXES = ("ATen/", "c10/", "torch/csrc/api/", "torch/csrc/autograd/", "torch/csrc/jit/")
HOOK_EXACT = {"torch/all.h", "torch/extension.h", "torch/torch.h", "torch/cuda.h", "torch/library.h"}
HOOK_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]', re.MULTILINE)
HOOK_PATTERNS = {
    "TORCH_LIBRARY": re.compile(r"(?<!STABLE_)TORCH_LIBRARY\b"),
    "TORCH_LIBRARY_IMPL": re.compile(r"(?<!STABLE_)TORCH_LIBRARY_IMPL\b"),
    "PYBIND11_MODULE": re.compile(r"\bPYBIND11_MODULE\b"),
    "AT_DISPATCH_": re.compile(r"\bAT_DISPATCH_\w+"),
    "TORCH_CHECK": re.compile(r"(?<!STD_)TORCH_CHECK\b"),
    "at::Tensor": re.compile(r"\bat::Tensor\b"),
    "at::ScalarType": re.compile(r"\bat::ScalarType\b"),
}


def hook_unstable_include(header: str) -> bool:
    if header.startswith(HOOK_PREFIXES) or header in HOOK_EXACT:
        return True
    return header.startswith("torch/") and not header.startswith(HOOK_ALLOWED)


def hook_hits(text: str) -> list[tuple[int, str, str]]:
    """(line, pattern, text) of every hit of the hook's patterns outside comments and strings."""
    masked = mask(text)
    hits = []
    for m in HOOK_INCLUDE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        if masked.splitlines()[line - 1].lstrip().startswith("#") and hook_unstable_include(m.group(1)):
            hits.append((line, "include", m.group(1)))
    for number, code in enumerate(masked.splitlines(), 1):
        if code.lstrip().startswith("#") and not code.lstrip()[1:].lstrip().startswith("define"):
            continue  # a directive other than #define: the hook reads its includes above, nothing else
        for name, pattern in HOOK_PATTERNS.items():
            m = pattern.search(code)
            if m:
                hits.append((number, name, m.group()))
    return hits


def _covers(hit: tuple[int, str, str], findings: list[tuple[int, str, str]]) -> bool:
    line, pattern, text = hit
    for f_line, kind, what in findings:
        if f_line != line:
            continue
        if pattern == "include" and kind == "include" and text in what:
            return True
        if pattern in ("at::Tensor", "at::ScalarType") and kind == "name" and what.startswith(pattern):
            return True
        if pattern == "AT_DISPATCH_" and kind == "macro" and what.startswith("AT_DISPATCH_"):
            return True
        if kind == "macro" and what == text:
            return True
    return False


def recall(project: Project, tree: Tree) -> dict[str, object]:
    """The hook's hits on the inventory's files (the named ones: third-party trees left out), and
    those the inventory has no finding for, each with what the line is."""
    total, missed = 0, []
    by_pattern: Counter[str] = Counter()
    for rel, result in sorted(project.files.items()):
        if not result.named:
            continue
        mine = [(f.line, f.kind, f.what) for f in result.findings]
        text = tree.read(rel)
        for hit in hook_hits(text):
            total += 1
            by_pattern[hit[1]] += 1
            if not _covers(hit, mine):
                source = text.splitlines()[hit[0] - 1].strip()
                missed.append({"path": rel, "line": hit[0], "pattern": hit[1], "source": source})
    found = 1 - len(missed) / max(total, 1)
    return {"hook_hits": total, "by_pattern": dict(by_pattern), "not_found": missed, "recall": found}


def timed(cmd: list[str], cwd: Path, runs: int) -> float:
    """Best wall time of `runs` fresh processes."""
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, cwd=cwd, capture_output=True, check=False)
        best = min(best, time.perf_counter() - start)
    return best


def speed(sdist: Path, folder: str, one_file: str, runs: int) -> dict[str, float]:
    """The CLI on the extracted `folder` and on `one_file` of it, as a developer runs it."""
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(sdist) as tf:
            tf.extractall(tmp, filter="data")
        (root,) = Path(tmp).iterdir()
        cli = [sys.executable, "-m", "keel_audit", "inventory"]
        return {
            f"{folder}/": timed([*cli, folder], root, runs),
            one_file: timed([*cli, one_file], root, runs),
            "sdist (read in place)": timed([*cli, str(sdist.resolve())], root, runs),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sdists", nargs="+", type=Path)
    parser.add_argument("--sample", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--speed", nargs=3, metavar=("SDIST", "FOLDER", "FILE"), help="time the CLI on FOLDER and FILE")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    know = knowledge()
    summary: dict[str, object] = {}
    pool = []
    for sdist in args.sdists:
        trees: dict[str, Tree] = {}
        (project,) = analyse([str(sdist)], know, trees=trees)
        tree = trees[str(sdist)]
        findings = project.findings
        folders = Counter("/".join(path.split("/")[:2]) for path, _ in findings)
        summary[sdist.name] = {
            "files": len(project.files),
            "third_party_left_out": project.third_party,
            "findings": len(findings),
            "by_folder": dict(folders.most_common()),
            "by_status": dict(Counter(f.rule.status for _, f in findings)),
            "torch_target_version": ".".join(map(str, project.target or ())),
            "regex_hook": recall(project, tree),
        }
        for path, f in findings:
            line = tree.read(path).splitlines()[f.line - 1].strip()
            advice = f.rule.replacement or f.rule.hint
            pool.append(
                {
                    "sdist": sdist.name,
                    "path": path,
                    "line": f.line,
                    "what": f.what,
                    "advice": advice,
                    "source": line[:160],
                }
            )
    sample = random.Random(args.seed).sample(pool, min(args.sample, len(pool)))
    (args.out / "sample.json").write_text(json.dumps(sample, indent=1) + "\n")
    if args.speed:
        sdist, folder, one = args.speed
        summary["seconds"] = speed(Path(sdist), folder, one, args.runs)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
