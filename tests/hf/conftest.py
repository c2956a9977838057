"""Fixtures of the loader tests: a tiny keel conversion of a synthetic GGUF (fast to load and mutate).

The real SmolLM2 conversion is the session fixture `smollm2_fp32` (tests/conftest.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.gguf_synth import tiny_llama, write_gguf  # noqa: E402


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer synthetic llama GGUF (tests/support/gguf_synth.py), untied so lm_head is a tensor too."""
    return write_gguf(tmp_path_factory.mktemp("tiny_gguf") / "tiny.gguf", tiny_llama(tied=False).spec)


@pytest.fixture(scope="session")
def tiny_hf(tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """keel's float32 conversion of `tiny_gguf`: config.json, model.safetensors, tokenizer files."""
    from keel.gguf.convert import write_checkpoint

    out = tmp_path_factory.mktemp("tiny_hf")
    write_checkpoint(tiny_gguf, out, "float32")
    return out
