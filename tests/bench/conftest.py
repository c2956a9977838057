"""What the tests of benchmarks's engine benchmarks share: a small random Llama, and running a script."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from keel_dev.checkpoints import write_random_llama
from keel_dev.forked import run_script

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return write_random_llama(
        tmp_path_factory.mktemp("tiny_llama"), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
    )  # fmt: skip


@pytest.fixture
def run_bench() -> Callable[..., subprocess.CompletedProcess]:
    """run_bench(script, *args): `python benchmarks/<script> ARGS` with this interpreter (the installed keel), output
    captured; forked from a parent that has imported torch (keel_dev.forked)."""

    def run(script: str, *args: str) -> subprocess.CompletedProcess:
        return run_script(BENCH / script, *args, timeout=300)

    return run
