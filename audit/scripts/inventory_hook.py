#!/usr/bin/env python3
"""pre-commit's entry for keel-audit inventory (.pre-commit-hooks.yaml at the repository's root).

pre-commit's python language would `pip install` the hook repository's root, which is keel itself
(a torch extension build); the inventory needs nothing but Python's standard library, so this
script runs it from the checkout pre-commit made, with nothing installed: the keel_audit package is
entered without its __init__ (which loads the binary audit's ELF readers and their dependencies).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

if sys.version_info < (3, 10):  # noqa: UP036 - pre-commit runs this with whatever python3 is first on PATH
    sys.exit("keel-audit inventory: needs Python 3.10 or newer")
PACKAGE = Path(__file__).resolve().parents[1] / "src" / "keel_audit"
stub = types.ModuleType("keel_audit")
stub.__path__ = [str(PACKAGE)]
sys.modules.setdefault("keel_audit", stub)

from keel_audit.inventory.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
