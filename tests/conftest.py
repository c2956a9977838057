"""Puts tests/ on sys.path so test modules can import the shared `support` helpers.

pytest runs with --import-mode=importlib (pyproject.toml): the repository root is not
put on sys.path, so `import keel` finds the installed wheel, not the source tree.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
