#!/usr/bin/env python
"""Runs `keel audit` from the source tree, before keel is installed (same arguments).

keel.audit needs only the standard library and pyelftools, so it is loaded by file path
under a private name; importing the `keel` package would load native libraries.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

AUDIT = Path(__file__).resolve().parents[1] / "keel" / "audit"


def load(where: Path = AUDIT):
    """keel/audit (or a copy of it at `where`) as the module `_keel_audit`, without importing keel."""
    spec = importlib.util.spec_from_file_location(
        "_keel_audit", where / "__init__.py", submodule_search_locations=[str(where)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["_keel_audit"] = module
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    load()
    from _keel_audit.cli import main  # noqa: E402  (registered by load())

    sys.exit(main(sys.argv[1:]))
