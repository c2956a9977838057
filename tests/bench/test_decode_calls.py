"""benchmarks/decode_calls.py runs end to end on a small random Llama (its numbers are not checked: a
benchmark, not a test of speed): every projection of one decode step is recorded and replayed, for bf16 and
fp8, at each thread count; bad arguments are refused."""

from __future__ import annotations

import pytest

# tiny_model and run_bench: tests/bench/conftest.py


def test_decode_calls_replays_every_projection_of_a_step_per_thread_count(tiny_model, run_bench):
    done = run_bench(
        "decode_calls.py", "--model", str(tiny_model), "--rounds", "2", "--reps", "2", "--prompt-tokens", "300"
    )  # a prompt of two chunks (256 tokens a step): the step recorded is the decode step after them
    assert done.returncode == 0, done.stderr
    out = done.stdout
    # 2 layers x (qkv, o, gate/up, down) + the lm_head; one column per weight shape, in model order
    assert out.count("9 calls per step, rows of x per call [1]") == 2, out
    header = "| round | threads | [128, 64] | [64, 64] | [256, 64] | [64, 128] | [512, 64] | ms per token |"
    assert out.count(header) == 2, out
    rows = [line for line in out.splitlines() if line.startswith("| ") and line.split("|")[2].strip() in ("1", "2")]
    assert len(rows) == 2 * 2 * 2, out  # 2 dtypes x 2 rounds x threads 1 and 2
    for quant in ("none", "fp8"):
        assert f"{quant}, 1 thread(s): median" in out and f"{quant}, 2 thread(s): median" in out, out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--rounds", "0"], "--rounds must be >= 1"),
        (["--threads", "0"], "--threads must all be >= 1"),
        (["--model-missing"], "does not exist"),
    ],
)
def test_decode_calls_refuses_bad_arguments(tiny_model, run_bench, tmp_path, args, message):
    model = str(tmp_path / "no-such-model") if args == ["--model-missing"] else str(tiny_model)
    done = run_bench("decode_calls.py", "--model", model, *[a for a in args if a != "--model-missing"])
    assert done.returncode != 0 and message in done.stdout + done.stderr
