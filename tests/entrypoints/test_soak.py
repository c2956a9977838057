"""A short serving soak (benchmarks/soak/serve.py on the tiny checkpoint, about 20 s of traffic): every request
ends in an allowed outcome, the KV cache and the running batch empty once idle, fds back to their start,
RSS flat after warm-up, and the mix really preempted, overloaded, aborted and refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.serve import BLOCK_SIZE, kv_bytes_per_block, needs_ops

pytestmark = [needs_ops, pytest.mark.slow]  # a 12 s soak, plus the server's start and warm-up

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak" / "serve.py"

KV_BLOCKS = 48  # 192 tokens: two prompts near the 128-token context (or two chats) do not fit, so they preempt


def test_short_soak_meets_every_goal(tiny_model, tmp_path):
    gib = KV_BLOCKS * kv_bytes_per_block(tiny_model) / (1 << 30)
    argv = ["--model", str(tiny_model), "--dtype", "float32", "--block-size", str(BLOCK_SIZE)]
    argv += ["--kv-cache-gib", repr(gib), "--max-num-seqs", "4", "--max-waiting", "4", "--concurrency", "6"]
    argv += [
        "--duration",
        "12",
        "--warmup",
        "4",
        "--burst-every",
        "4",
        "--max-body-bytes",
        "4096",
        "--long-tokens",
        "0",
    ]
    argv += ["--deadline", "60", "--idle-timeout", "30", "--json", str(tmp_path / "soak.json")]
    proc = subprocess.run([sys.executable, str(SOAK), *argv], capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    # exit 1 is also an uncaught exception: then there is no JSON, and the soak's own output says why
    assert (tmp_path / "soak.json").exists(), proc.stdout[-3000:] + proc.stderr[-5000:]
    result = json.loads((tmp_path / "soak.json").read_text())
    figures, failed = result["figures"], [goal for goal, ok in result["goals"].items() if not ok]
    assert not failed, f"soak goals failed: {failed}; failures {result['failures'][:5]}; {figures}"
    outcomes = figures["outcomes"]
    assert set(outcomes) == {"completed", "client_aborted", "4xx", "503"}, outcomes
    assert outcomes["completed"] >= 10 and len(figures["bursts"]) >= 2, figures
    assert figures["kv_blocks_total"] == KV_BLOCKS and figures["max_kv_blocks_used"] > KV_BLOCKS // 2, figures
    assert figures["server_exit_code"] == 0 and figures["rss_growth"] < 0.05
