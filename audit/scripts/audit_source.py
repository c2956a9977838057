#!/usr/bin/env python
"""Runs keel-audit from this checkout's audit/ folder without installing it (same arguments).

For iterating on the audit itself; builds and tests use the installed distribution
(`pip install ./audit`), like any release manager would.
"""

from __future__ import annotations

import sys
from pathlib import Path

AUDIT = Path(__file__).resolve().parents[1]  # audit/, the folder holding keel_audit/

if __name__ == "__main__":
    sys.path.insert(0, str(AUDIT))
    from keel_audit.cli import main  # noqa: E402

    sys.exit(main(sys.argv[1:]))
