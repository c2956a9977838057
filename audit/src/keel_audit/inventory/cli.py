"""`keel-audit inventory PATH...`: what a C++ torch extension must change to reach the LibTorch
stable ABI, read from its source. Exit 0 nothing unstable (or nothing new against --baseline),
1 findings, 2 could not read an input."""

from __future__ import annotations

import argparse
import json
import os
import sys
from importlib import metadata
from pathlib import Path
from typing import TextIO

from ..errors import AuditError, AuditInputError
from . import baseline as baseline_file
from . import fix, report
from .knowledge import Knowledge, knowledge
from .project import Project, analyse
from .sources import Tree


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "inputs", nargs="+", metavar="PATH", help="a source folder, source files, or an sdist (.tar.gz, .zip)"
    )
    parser.add_argument(
        "-I",
        dest="include_dirs",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder the build puts on the include path (relative to a folder input, or to the working "
        "directory for file inputs); without one, an unresolved include is looked for by path suffix",
    )
    parser.add_argument("--json", action="store_true", help="print the keel-audit-inventory/1 JSON document")
    parser.add_argument("--sarif", metavar="FILE", help="also write SARIF 2.1.0 to FILE ('-': standard output)")
    parser.add_argument(
        "--include-third-party",
        action="store_true",
        help="also read vendored third-party trees (cutlass, cub, composable_kernel, third_party/, ...)",
    )
    parser.add_argument(
        "--baseline", metavar="FILE", help="findings FILE accepts (per file and construct) do not fail the run"
    )
    parser.add_argument("--write-baseline", metavar="FILE", help="write every finding to FILE as accepted")
    parser.add_argument(
        "--fix",
        metavar="DIFF",
        help="write a unified diff of the mechanical substitutions to DIFF ('-': standard output, the report "
        "then goes to standard error); the rest stays in the report as hand changes",
    )


def _version() -> str:
    try:
        return metadata.version("keel-audit")
    except metadata.PackageNotFoundError:
        return "unknown"


def _emit(target: str, text: str) -> None:
    if target == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        Path(target).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise AuditInputError(f"cannot write {target}: {exc.strerror or exc}") from exc


def _renames(know: Knowledge) -> dict[str, str]:
    return {k: r.fix for k, r in know.names.items() if isinstance(r.fix, str) and not k.endswith("::")}


def write_fix(projects: list[Project], trees: dict[str, Tree], know: Knowledge) -> tuple[str, int, int]:
    """The diff of every file with mechanical edits; also how many findings it fixes and leaves."""
    chunks: list[str] = []
    fixed = left_count = 0
    rename = _renames(know)
    for project in projects:
        tree = trees[project.label]
        for rel, result in sorted(project.files.items()):
            if not result.findings:
                continue
            text = tree.read(rel)
            edits, left = fix.edits_for(text, result.findings, rename)
            fixed += len(result.findings) - len(left)
            left_count += len(left)
            if edits:
                chunks.append(fix.unified_diff(project.prefix + rel, text, fix.apply(text, edits)))
    return "".join(chunks), fixed, left_count


def run(args: argparse.Namespace) -> int:
    """Run the inventory; see the module docstring for the exit codes."""
    know = knowledge()
    trees: dict[str, Tree] = {}
    projects = analyse(
        list(args.inputs), know, third_party=args.include_third_party, trees=trees, include_dirs=args.include_dirs
    )
    new = None
    if args.baseline:
        new = baseline_file.new_findings(projects, baseline_file.read(Path(args.baseline)))
    doc = report.document(projects, know, new)
    out: TextIO = sys.stdout
    if args.fix:
        diff, fixed, left = write_fix(projects, trees, know)
        _emit(args.fix, diff)
        if args.fix == "-":
            out = sys.stderr
        print(
            f"keel-audit inventory --fix: {fixed} finding(s) rewritten, {left} left for a hand change", file=sys.stderr
        )
    if args.write_baseline:
        baseline_file.write(projects, Path(args.write_baseline))
    if args.sarif:
        _emit(args.sarif, json.dumps(report.sarif(doc, _version()), indent=1) + "\n")
        if args.sarif == "-":
            out = sys.stderr
    text = json.dumps(doc, indent=1) if args.json else report.table(doc)
    print(text, file=out, flush=True)
    return int(doc["exit_code"])


def main(argv: list[str]) -> int:
    """`keel-audit inventory ...` (argv without the verb)."""
    parser = argparse.ArgumentParser(
        prog="keel-audit inventory",
        description="What a C++ torch extension must change to reach the LibTorch stable ABI, read from its "
        "source: each unstable use with its stable replacement and the torch release that has it, and the "
        "TORCH_TARGET_VERSION the migrated source needs. Exit 0 nothing unstable (nothing new against "
        "--baseline), 1 findings, 2 could not read an input.",
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except AuditError as exc:
        print(f"keel-audit inventory: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
