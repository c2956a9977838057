"""scripts/bench/engine_step.py runs end to end on a small random Llama (its numbers are not checked: a
benchmark, not a test of speed), beside its competing process, and refuses bad arguments."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from keel_dev.checkpoints import write_random_llama

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "engine_step.py"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return write_random_llama(
        tmp_path_factory.mktemp("tiny_llama"), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
    )  # fmt: skip


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def test_engine_step_prints_each_repeats_decode_and_mixed_step(tiny_model):
    done = run("--model", str(tiny_model), "--batch", "3", "--steps", "3", "--repeats", "2", "--prompt-tokens", "5",
               "--threads", "1", "--hog", "1", "4")  # fmt: skip
    assert done.returncode == 0, done.stderr
    repeats = [line for line in done.stdout.splitlines() if line.startswith("repeat ")]
    assert len(repeats) == 2 and all("decode step p50" in r and "2 decodes + a 5-token prompt" in r for r in repeats)
    assert "hog [1.0, 4.0]" in done.stdout


@pytest.mark.parametrize(
    "args, message",
    [(["--batch", "0"], "must be >= 1"), (["--baseline", "/nonexistent"], "expected a keel source checkout")],
)
def test_engine_step_refuses_bad_arguments(tiny_model, args, message):
    done = run("--model", str(tiny_model), *args)
    assert done.returncode != 0 and message in done.stdout + done.stderr
