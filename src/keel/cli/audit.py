"""`keel audit`: the wheel audit of the separate `keel-audit` distribution (audit/ in keel's repository).

keel's wheel does not contain the audit: a release manager installs it alone (no torch needed).
This verb delegates to it when it is installed and says how to install it when it is not.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

INSTALL_HINT = (
    "keel audit: the audit is the separate distribution keel-audit, which is not installed; "
    "install it with `pip install ./audit` from a keel checkout, then run `keel audit ...` or `keel-audit ...`"
)


def _missing(_args: argparse.Namespace) -> int:
    print(INSTALL_HINT, file=sys.stderr)
    return 2


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `audit` verb (keel_audit's own arguments when it is installed)."""
    parser = subparsers.add_parser(
        "audit",
        help="audit a wheel's ELF objects for torch/CPython ABI stability (needs keel-audit)",
        description="Audit every ELF object of a wheel, directory, .so files or "
        "installed distribution. Exit 0 pass, 1 gate failed, 2 could not audit.",
    )
    if importlib.util.find_spec("keel_audit") is None:
        parser.add_argument("inputs", nargs=argparse.REMAINDER, help="(keel-audit is not installed)")
        parser.set_defaults(func=_missing)
        return
    from keel_audit.cli import add_arguments, run

    add_arguments(parser)
    parser.set_defaults(func=run)
