"""`keel audit`: gate a wheel on the torch stable ABI (see keel/audit)."""

from __future__ import annotations

import argparse

from keel.audit.cli import add_arguments, run


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `audit` verb."""
    parser = subparsers.add_parser(
        "audit",
        help="audit a wheel's ELF objects for torch/CPython ABI stability",
        description="Audit every ELF object of a wheel, directory, .so files or "
        "installed distribution. Exit 0 pass, 1 gate failed, 2 could not audit.",
    )
    add_arguments(parser)
    parser.set_defaults(func=run)
