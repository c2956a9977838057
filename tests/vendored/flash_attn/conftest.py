"""Puts this folder on sys.path so the tests can import the fp64 reference (flash_attn_ref)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
