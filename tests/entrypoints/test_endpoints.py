"""The serving-benchmark client's request shape on the real engine, /tokenize, /detokenize, /version,
--max-model-len, and `keel serve`'s new flags' errors."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import openai
import pytest
from support.serve import MODEL_NAME, needs_ops, start_server

pytestmark = needs_ops


def post(base: str, path: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_benchmark_client_request_shape(served):
    """What vLLM's `bench serve` (openai-chat) sends: list-of-parts content, max_completion_tokens,
    ignore_eos, stream_options include_usage + continuous_usage_stats; 8 concurrent, all must succeed."""
    client = served.async_client()

    async def one(i: int) -> list:
        stream = await client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": [{"type": "text", "text": f"benchmark prompt {i}"}]}],
            temperature=0.0,
            max_completion_tokens=12,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            extra_body={"ignore_eos": True},
        )
        return [chunk async for chunk in stream]

    async def run() -> list:
        try:
            return await asyncio.gather(*(one(i) for i in range(8)))
        finally:
            await client.close()

    for chunks in asyncio.run(run()):
        assert all(c.usage is not None for c in chunks)
        assert chunks[-1].usage.completion_tokens == 12  # ignore_eos: all of max_completion_tokens
        counts = [c.usage.completion_tokens for c in chunks]
        assert counts == sorted(counts)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text and [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_tokenize_detokenize_version(served):
    tok = served.engine.engine.tokenizer
    status, body = post(served.base_url, "/tokenize", {"model": MODEL_NAME, "prompt": "The quick brown fox"})
    assert (
        status == 200 and body["tokens"] == tok.encode("The quick brown fox") and body["count"] == len(body["tokens"])
    )
    assert body["max_model_len"] == 128 and body["token_strs"] is None
    status, back = post(served.base_url, "/detokenize", {"model": MODEL_NAME, "tokens": body["tokens"]})
    assert status == 200 and back["prompt"] == tok.decode(body["tokens"])
    messages = [{"role": "user", "content": "hi"}]
    status, chat = post(served.base_url, "/tokenize", {"messages": messages, "return_token_strs": True})
    r = served.client().chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=1)
    assert status == 200 and chat["count"] == r.usage.prompt_tokens == len(chat["token_strs"])
    assert post(served.base_url, "/detokenize", {"tokens": [1, 10**6]})[0] == 400
    assert post(served.base_url, "/tokenize", {"model": "other", "prompt": "x"})[0] == 404
    with urllib.request.urlopen(served.base_url + "/version", timeout=10) as resp:
        from keel import __version__

        assert json.loads(resp.read()) == {"version": __version__}


def test_max_model_len_caps_requests(tiny_model):
    from keel.entrypoints.openai.server_config import ServerConfig

    served = start_server(tiny_model, limits=ServerConfig(max_tokens=512, max_model_len=40))
    try:
        client = served.client()
        assert client.models.retrieve(MODEL_NAME).model_extra["max_model_len"] == 40
        with pytest.raises(openai.BadRequestError, match="maximum context length is 40"):
            client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=60)
        r = client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=8, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 8
    finally:
        served.stop()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--max-model-len", "100000"], "larger than the model's context (128 tokens)"),
        (["--shutdown-timeout", "-1"], "--shutdown-timeout must be >= 0"),
    ],
)
def test_serve_flag_errors(tiny_model, capsys, args, needle):
    from keel.cli import main

    code = main(["serve", "--model", str(tiny_model), "--dtype", "float32", "--device", "cpu", *args])
    assert code == 1 and needle in capsys.readouterr().err


def test_serve_quantization_choices(capsys):
    from keel.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--quantization", "int4"])
    assert "invalid choice: 'int4'" in capsys.readouterr().err


def test_serve_fp8_quantization_answers(tiny_model):
    """--quantization fp8 reaches the engine (its FP8 linear layers): the server answers from them."""
    served = start_server(tiny_model, engine_kwargs={"quantization": "fp8"})
    try:
        assert served.engine.engine.quantization == "fp8"
        r = served.client().completions.create(
            model=MODEL_NAME, prompt="hi", max_tokens=4, extra_body={"ignore_eos": True}
        )
        assert r.usage.completion_tokens == 4
    finally:
        served.stop()
