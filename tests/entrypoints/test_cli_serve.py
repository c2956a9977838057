"""`keel serve` as a process: it starts, answers the openai client, stops on SIGINT, and answers the same
after a restart (the mechanism of scripts/release/serve_upgrade.py, here on one torch)."""

from __future__ import annotations

import sys

import pytest
from support.scripts import load_script
from support.serve import needs_ops

pytestmark = needs_ops

serve_upgrade = load_script("scripts/release/serve_upgrade.py")


@pytest.mark.slow  # two `keel serve` processes, one after the other
def test_keel_serve_restart_answers_the_same(tiny_model):
    first = serve_upgrade.serve_and_ask(sys.executable, str(tiny_model), max_tokens=8)
    second = serve_upgrade.serve_and_ask(sys.executable, str(tiny_model), max_tokens=8)
    assert first["exit_code"] == 0 and second["exit_code"] == 0  # SIGINT: graceful shutdown
    assert first["completion_tokens"] > 0 and first["torch"]
    assert (first["completion"], first["chat"]) == (second["completion"], second["chat"])


def test_installed_keel_files_are_hashed():
    digest = serve_upgrade.keel_files_digest(sys.executable)
    assert any(name.endswith("entrypoints/openai/api_server.py") for name in digest)
    assert all(len(h) == 64 for h in digest.values())
