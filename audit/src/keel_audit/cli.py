"""Arguments and runner of `keel-audit` (also `python -m keel_audit` and keel's `keel audit` verb)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .analysis import audit
from .errors import AuditError
from .preflight import preflight
from .result import INVALID


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
        help="fail on any shim symbol newer than X.Y (the oldest torch the wheel must load on)",
    )
    parser.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="PATTERN",
        help="library (glob on path or file name) that may be unstable; stale patterns fail",
    )
    rules = parser.add_mutually_exclusive_group()
    rules.add_argument(
        "--strict",
        action="store_true",
        help="keel's own release policy: its linkage rules (static cudart, only libtorch_cpu/libtorch_cuda, "
        "nothing of torch exported, torch>= equal to the floor) become errors",
    )
    rules.add_argument("--policy", metavar="FILE", help="a policy JSON file (see data/policy.json)")
    parser.add_argument("--json", action="store_true", help="print the versioned JSON document instead")


def run(args: argparse.Namespace) -> int:
    """Run the audit; 0 pass, 1 gate failed, 2 could not audit."""
    try:
        result = audit(
            args.inputs, target_torch=args.target_torch, allow=args.allow, policy=args.policy, strict=args.strict
        )
    except AuditError as exc:
        print(f"keel audit: error: {exc}", file=sys.stderr)
        return exc.exit_code
    try:
        print(json.dumps(result.to_json(), indent=2) if args.json else result.render(), flush=True)
    except BrokenPipeError:  # `keel-audit ... | head`: the reader left; the exit code still says it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return result.exit_code
    if result.exit_code == 2:
        bad = [lib for lib in result.libraries if lib.verdict == INVALID]
        print(
            f"keel audit: error: {', '.join(result.sources)}: {len(bad)} of {len(result.libraries)} ELF "
            "object(s) could not be read as ELF shared objects:",
            file=sys.stderr,
        )
        for lib in bad:
            print(f"  {lib.path}: {lib.error}", file=sys.stderr)
    elif result.exit_code == 1:
        print("keel audit: gate failed: see the ERROR lines above", file=sys.stderr)
    return result.exit_code


def add_preflight_arguments(parser: argparse.ArgumentParser) -> None:
    """`keel-audit preflight`'s arguments on an existing parser."""
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="TARGET",
        help="a .whl, a directory, .so files, or an installed distribution name (as the audit takes)",
    )
    parser.add_argument(
        "--torch",
        required=True,
        metavar="CANDIDATE",
        help="the torch to check against: a torch .whl (read without installing), a site-packages folder, "
        "`installed` (this environment's torch), or a version such as 2.15.0 (fetched with `pip download "
        "torch==VERSION --no-deps` into --cache; the only case that uses the network)",
    )
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="WHEEL_OR_DIR",
        help="more libraries of the candidate image, e.g. the nvidia-* wheels with the CUDA runtime",
    )
    parser.add_argument(
        "--assume",
        action="append",
        default=[],
        metavar="LIBRARY",
        help="a DT_NEEDED name the target image provides (e.g. libcuda.so.1 on a GPU host); its symbols are "
        "not checked",
    )
    parser.add_argument(
        "--no-host",
        action="store_true",
        help="do not look on this machine for libraries that neither the target nor the candidate provides",
    )
    parser.add_argument(
        "--cache", metavar="DIR", help="where `--torch VERSION` downloads go (~/.cache/keel-audit/torch)"
    )
    parser.add_argument("--json", action="store_true", help="print the keel-audit-preflight/1 JSON document instead")


def run_preflight(args: argparse.Namespace) -> int:
    """Run the preflight; 0 every library loads, 1 some does not, 2 could not read an input."""
    try:
        result = preflight(
            args.inputs,
            args.torch,
            also=args.also,
            host=not args.no_host,
            assume=args.assume,
            cache=Path(args.cache) if args.cache else None,
        )
    except AuditError as exc:
        print(f"keel-audit preflight: error: {exc}", file=sys.stderr)
        return exc.exit_code
    try:
        print(json.dumps(result.to_json(), indent=2) if args.json else result.render(), flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return result.exit_code


def main(argv: list[str] | None = None) -> int:
    """`keel-audit` / `python -m keel_audit` entry point (`keel-audit preflight ...` for the preflight)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["inventory"]:
        from .inventory.cli import main as inventory_main  # the source inventory needs no ELF reader

        return inventory_main(argv[1:])
    if argv[:1] == ["preflight"]:
        pre = argparse.ArgumentParser(
            prog="keel-audit preflight",
            description="Will every library of TARGET load on the candidate torch? Resolves every undefined "
            "symbol against the candidate's libraries without installing it. Exit 0 all load, 1 some do not, "
            "2 could not read an input.",
        )
        add_preflight_arguments(pre)
        return run_preflight(pre.parse_args(argv[1:]))
    parser = argparse.ArgumentParser(
        prog="keel-audit",
        description="Audit the ELF objects of a wheel for torch stable-ABI compatibility. "
        "Exit 0 pass, 1 an error-severity finding, 2 could not audit. "
        "`keel-audit preflight TARGET --torch CANDIDATE`: will TARGET load on that torch (see its --help). "
        "`keel-audit inventory PATH...`: what a C++ extension's source must change for the stable ABI.",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
