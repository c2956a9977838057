"""benchmarks/engine_step.py runs end to end on a small random Llama (its numbers are not checked: a
benchmark, not a test of speed), beside its competing process, and refuses bad arguments."""

from __future__ import annotations

import pytest

# tiny_model and run_bench: tests/bench/conftest.py


def test_engine_step_prints_each_repeats_decode_and_mixed_step(tiny_model, run_bench):
    done = run_bench("engine_step.py", "--model", str(tiny_model), "--batch", "3", "--steps", "3", "--repeats", "2",
                     "--prompt-tokens", "5", "--threads", "1", "--hog", "1", "4")  # fmt: skip
    assert done.returncode == 0, done.stderr
    repeats = [line for line in done.stdout.splitlines() if line.startswith("repeat ")]
    assert len(repeats) == 2 and all("decode step p50" in r and "2 decodes + a 5-token prompt" in r for r in repeats)
    assert "hog [1.0, 4.0]" in done.stdout


@pytest.mark.parametrize(
    "args, message",
    [(["--batch", "0"], "must be >= 1"), (["--baseline", "/nonexistent"], "expected a keel source checkout")],
)
def test_engine_step_refuses_bad_arguments(tiny_model, run_bench, args, message):
    done = run_bench("engine_step.py", "--model", str(tiny_model), *args)
    assert done.returncode != 0 and message in done.stdout + done.stderr
