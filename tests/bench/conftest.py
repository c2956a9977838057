"""What the tests of benchmarks's engine benchmarks share: a small random Llama, and running a script."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from keel_dev.checkpoints import write_random_llama

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return write_random_llama(
        tmp_path_factory.mktemp("tiny_llama"), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
    )  # fmt: skip


@pytest.fixture
def run_bench() -> Callable[..., subprocess.CompletedProcess]:
    """run_bench(script, *args): benchmarks/<script> with this interpreter (the installed keel), output captured."""

    def run(script: str, *args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, str(BENCH / script), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300)

    return run
