"""`keel serve --device cuda` answers: the server process on the GPU completes a prompt greedily with the text
the offline engine on the GPU gives for it, and its /metrics count the tokens. The model is a random-weight one
with SmolLM2's layer shapes (few layers, a 4096-word vocabulary), written without transformers. Skipped without
a GPU: no GPU has run this yet (compiled, not run)."""

from __future__ import annotations

import json
import signal
import urllib.request

import pytest
import torch
from keel_dev.checkpoints import write_random_llama
from keel_dev.server import start_server

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

PROMPT = "t5 t9 t100 t7 t300"


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def test_keel_serve_on_cuda_answers(tmp_path):
    from keel import LLM, SamplingParams

    model = write_random_llama(tmp_path / "model", seed=3, num_hidden_layers=2, vocab_size=4096)
    args = ["--model", str(model), "--device", "cuda", "--dtype", "bf16", "--kv-cache-gib", "0.25"]
    server = start_server([*args, "--log-level", "warning"], timeout_s=180)
    base = server.base_url
    try:
        body = {"model": str(model), "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        answer = _post(base + "/v1/completions", body)
        metrics = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    finally:
        server.stop(signal.SIGTERM)
    text = answer["choices"][0]["text"]
    assert answer["usage"]["completion_tokens"] == 8 and text.strip()
    offline = LLM(str(model), dtype="bfloat16", device="cuda", progress=False)
    want = offline.generate(PROMPT, SamplingParams(max_tokens=8, ignore_eos=True))[0].text
    assert text == want, f"served {text!r}, offline CUDA engine {want!r}"
    counted = [
        float(ln.rsplit(" ", 1)[1]) for ln in metrics.splitlines() if ln.startswith("vllm:generation_tokens_total")
    ]
    assert counted and counted[0] >= 8, f"/metrics did not count the 8 tokens: {counted}"
