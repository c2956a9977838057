"""`keel audit`: the audit of the separate `keel-audit` distribution (audit/ in keel's repository).

keel's wheel does not contain the audit: a release manager installs it alone (no torch needed). Every
argument goes to `keel-audit` unchanged (`keel audit preflight ...`, `keel audit inventory ...` too); without
it installed, the verb says how to install it.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

INSTALL_HINT = (
    "keel audit: the audit is the separate distribution keel-audit, which is not installed; "
    "install it with `pip install ./audit` from a keel checkout, then run `keel audit ...` or `keel-audit ...`"
)


def delegate(argv: list[str]) -> int:
    """`keel-audit ARGV` (exit 2 with the install hint when keel-audit is missing)."""
    if importlib.util.find_spec("keel_audit") is None:
        print(INSTALL_HINT, file=sys.stderr)
        return 2
    from keel_audit.cli import main

    return main(argv)


def register(subparsers: argparse._SubParsersAction) -> None:
    """List the verb in `keel --help`; `keel.cli.main` hands its arguments to `delegate` before parsing."""
    parser = subparsers.add_parser(
        "audit",
        help="audit a wheel's ELF objects for torch/CPython ABI stability; preflight; source inventory "
        "(needs keel-audit)",
        add_help=False,
    )
    parser.add_argument("args", nargs=argparse.REMAINDER)
    parser.set_defaults(func=lambda args: delegate(args.args))
