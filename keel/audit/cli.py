"""Arguments and runner of `keel audit` (shared by keel.cli.audit and `python -m keel.audit`)."""

from __future__ import annotations

import argparse
import json
import sys

from .analysis import audit
from .errors import AuditError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The audit's arguments on an existing parser."""
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="a .whl, a directory, .so files, or an installed distribution name",
    )
    parser.add_argument(
        "--target-torch",
        metavar="X.Y",
        help="fail on any shim symbol newer than X.Y or unknown (implies --require-stable)",
    )
    parser.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="PATTERN",
        help="library (glob on path or file name) that may be unstable; stale patterns fail",
    )
    parser.add_argument("--require-stable", action="store_true", help="fail when a library is not stable")
    parser.add_argument("--json", action="store_true", help="print the versioned JSON document instead")


def run(args: argparse.Namespace) -> int:
    """Run the audit; 0 pass, 1 gate failed, 2 could not audit."""
    try:
        result = audit(
            args.inputs, target_torch=args.target_torch, allow=args.allow, require_stable=args.require_stable
        )
    except AuditError as exc:
        print(f"keel audit: error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(result.to_json(), indent=2) if args.json else result.render())
    if result.exit_code == 2:
        print("keel audit: error: some libraries could not be read as ELF shared objects", file=sys.stderr)
    elif result.exit_code == 1:
        print("keel audit: gate failed: see the FAIL lines above", file=sys.stderr)
    return result.exit_code


def main(argv: list[str] | None = None) -> int:
    """`python -m keel.audit` entry point."""
    parser = argparse.ArgumentParser(
        prog="keel audit", description="Audit the ELF objects of a wheel for torch stable-ABI compatibility."
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
