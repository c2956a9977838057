"""Make the fuzz harness and its examples importable under pytest's importlib import mode."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
