"""`keel serve` as a process: it starts, answers the openai client, stops on SIGINT, and answers the same
after a restart (what each replica does in a rolling upgrade, deploy/fleet/rolling_upgrade.py, here on one
torch)."""

from __future__ import annotations

import sys
import urllib.request
from typing import Any

import openai
import pytest
from keel_dev.server import start_server
from support.scripts import load_script
from support.serve import needs_ops

pytestmark = needs_ops

fleet = load_script("deploy/fleet/fleet.py")
QUESTION = "What is the capital of France?"


def serve_and_ask(model: str) -> dict[str, Any]:
    """Start `keel serve`, ask a completion and a chat question (greedy), read its torch from /metrics, stop it."""
    server = start_server(
        ["--model", model, "--dtype", "float32", "--served-model-name", "m", "--log-level", "warning"]
    )
    try:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
        completion = client.completions.create(model="m", prompt=QUESTION, max_tokens=8, temperature=0)
        chat = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": QUESTION}], max_tokens=8, temperature=0
        )
        metrics = urllib.request.urlopen(server.base_url + "/metrics", timeout=10).read().decode()
    finally:
        server.stop()
    info = next(line for line in metrics.splitlines() if line.startswith("keel_build_info{"))
    return {
        "torch": info.split('torch_version="')[1].split('"')[0],
        "completion": completion.choices[0].text,
        "chat": chat.choices[0].message.content,
        "completion_tokens": completion.usage.completion_tokens,
        "exit_code": server.proc.returncode,
    }


@pytest.mark.slow  # two `keel serve` processes, one after the other
def test_keel_serve_restart_answers_the_same(tiny_model):
    first = serve_and_ask(str(tiny_model))
    second = serve_and_ask(str(tiny_model))
    assert first["exit_code"] == 0 and second["exit_code"] == 0  # SIGINT: graceful shutdown
    assert first["completion_tokens"] > 0 and first["torch"]
    assert (first["completion"], first["chat"]) == (second["completion"], second["chat"])


def test_installed_keel_files_are_hashed():
    digest = fleet.keel_files_digest(sys.executable)
    assert any(name.endswith("entrypoints/openai/api_server.py") for name in digest)
    assert all(len(h) == 64 for h in digest.values())
