"""`keel generate` / `keel chat` end to end on a tiny checkpoint (offline cache)."""

from __future__ import annotations

import io

import pytest
from support.native import needs_ops

from keel.cli import main

pytestmark = needs_ops


def test_generate_streams_to_stdout(hf_cache, capsys):
    rc = main(
        [
            "generate",
            "--model",
            "keel-test/tiny-llama",
            "--dtype",
            "fp32",
            "--prompt",
            "The quick",
            "--max-tokens",
            "8",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 0 and out.endswith("\n") and "decode" in err


def test_generate_batch_and_chat_flag(hf_cache, capsys):
    rc = main(
        [
            "generate",
            "--model",
            "keel-test/tiny-qwen3",
            "--dtype",
            "fp32",
            "--prompt",
            "a",
            "--prompt",
            "b c d",
            "--chat",
            "--max-tokens",
            "4",
            "--temperature",
            "0.5",
            "--seed",
            "3",
        ]
    )
    out, _ = capsys.readouterr()
    assert rc == 0 and "--- prompt 1 ---" in out


def test_missing_model_error_writes_nothing(hf_cache, capsys):
    rc = main(["generate", "--model", "keel-test/absent", "--prompt", "x"])
    out, err = capsys.readouterr()
    assert rc == 1 and out == ""
    assert "keel-test/absent" in err and str(hf_cache) in err


def test_default_model_missing_says_fetch_demo(hf_cache, capsys):
    rc = main(["generate", "--prompt", "x"])
    out, err = capsys.readouterr()
    assert rc == 1 and out == "" and "keel models fetch-demo" in err


def test_chat_session(hf_cache, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\n/reset\nagain\n/exit\n"))
    rc = main(["chat", "--model", "keel-test/tiny-smollm2", "--dtype", "fp32", "--max-tokens", "4"])
    out, _ = capsys.readouterr()
    assert rc == 0 and out.count("\n") >= 2


@pytest.mark.parametrize("argv", [["--top-p", "0"], ["--max-tokens", "0"]])
def test_bad_sampling_args(hf_cache, capsys, argv):
    rc = main(["generate", "--model", "keel-test/tiny-llama", "--prompt", "x", *argv])
    assert rc == 1 and "SamplingParams" in capsys.readouterr().err


@pytest.mark.parametrize("flag, want_chat", [([], True), (["--chat"], True), (["--raw"], False)])
def test_chat_template_is_the_default(hf_cache, capsys, monkeypatch, flag, want_chat):
    from keel.engine import LLM

    used = []
    real_chat = LLM.chat
    monkeypatch.setattr(LLM, "chat", lambda self, *a, **k: used.append("chat") or real_chat(self, *a, **k))
    argv = ["generate", "--model", "keel-test/tiny-smollm2", "--dtype", "fp32", "--prompt", "hi", "--max-tokens", "2"]
    assert main([*argv, *flag]) == 0
    assert (used == ["chat"]) == want_chat
