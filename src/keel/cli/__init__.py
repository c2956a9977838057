"""`keel` command line: one module per verb, each exposing ``register(subparsers)``."""

from __future__ import annotations

import argparse
import importlib
import sys

# verb -> its module under src/keel/cli, in the order `keel --help` lists them
_VERBS = {
    "generate": "generate",
    "chat": "chat",
    "serve": "serve",
    "models": "model_cache",
    "audit": "audit",
    "doctor": "doctor",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="keel", description="keel: a stable-ABI LLM inference engine")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for module in _VERBS.values():
        importlib.import_module(f"keel.cli.{module}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["audit"]:  # keel-audit parses its own arguments, options and verbs included
        from keel.cli.audit import delegate

        return delegate(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
