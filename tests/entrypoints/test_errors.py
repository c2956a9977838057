"""Every error `keel serve` reports: OpenAI's error body with the right status, through the real client."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest
from support.serve import MODEL_NAME, StepControl, needs_ops, start_server

pytestmark = needs_ops

LONG = "keel builds one wheel that survives torch upgrades. " * 40  # far beyond the 128-token context


def post(base_url: str, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(
        base_url + path, data=body, headers={"content-type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def error_of(exc: openai.APIStatusError) -> dict:
    body = exc.body
    assert isinstance(body, dict) and set(body) >= {"message", "type", "param", "code"}, body
    return body


@pytest.mark.parametrize(
    ("kwargs", "param", "needle"),
    [
        (dict(prompt=LONG), "prompt", "maximum context length is 128"),
        (dict(prompt="hi", max_tokens=127), "max_tokens", "maximum context length is 128"),
        (dict(prompt="hi", max_tokens=100_000), "max_tokens", "allows at most 512"),
        (dict(prompt="hi", temperature=3.0), "temperature", "less than or equal to 2"),
        (dict(prompt="hi", top_p=0.0), "top_p", "greater than 0"),
        (dict(prompt="hi", n=0), "n", "greater than or equal to 1"),
        (dict(prompt=""), None, "prompt must not be empty"),
        (dict(prompt=[5, 999_999]), "prompt", "outside [0, 320)"),
        (dict(prompt="hi", logprobs=21), "logprobs", "less than or equal to 20"),
        (dict(prompt="hi", extra_body={"use_beam_search": True}), None, "keel has no beam search"),
        (dict(prompt="hi", suffix="x"), None, "fill-in-the-middle"),
        (dict(prompt="hi", max_tokens=0), None, "max_tokens: 0 is only allowed with echo"),
        (dict(prompt="hi", extra_body={"stop_token_ids": [5, 4000]}), "stop_token_ids", "outside [0, 320)"),
        (dict(prompt="hi", logit_bias={"7": 101}), "logit_bias", "[-100, 100]"),
        (dict(prompt="hi", best_of=1, n=2), None, "best_of must be >= n"),
        (dict(prompt="hi", stop=[""]), None, "stop strings must be non-empty"),
        (dict(prompt="hi", extra_body={"bogus_field": 1}), "bogus_field", "not a supported parameter"),
    ],
)
def test_completion_bad_request_400(served, kwargs, param, needle):
    with pytest.raises(openai.BadRequestError) as info:
        served.client().completions.create(model=MODEL_NAME, **kwargs)
    err = error_of(info.value)
    assert info.value.status_code == 400 and err["type"] == "invalid_request_error"
    assert needle in err["message"] and err["param"] == param, err


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        (dict(messages=[{"role": "user", "content": LONG}]), "maximum context length is 128"),
        (dict(messages=[]), "messages"),
        (dict(messages=[{"role": "wizard", "content": "hi"}]), "role"),
        (dict(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), "type"),
        (
            dict(messages=[{"role": "user", "content": "hi"}], tools=[{"type": "function", "function": {"name": "f"}}]),
            "needs a tool-call parser",
        ),
        (dict(messages=[{"role": "user", "content": "hi"}], max_tokens=4, max_completion_tokens=5), "disagree"),
    ],
)
def test_chat_bad_request_400(served, kwargs, needle):
    with pytest.raises(openai.BadRequestError) as info:
        served.client().chat.completions.create(model=MODEL_NAME, **kwargs)
    assert needle in error_of(info.value)["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_unknown_model_404(served, stream):
    with pytest.raises(openai.NotFoundError) as info:
        served.client().chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=stream
        )
    err = error_of(info.value)
    assert err["code"] == "model_not_found" and err["param"] == "model" and "gpt-4o" in err["message"]
    with pytest.raises(openai.NotFoundError):
        served.client().models.retrieve("gpt-4o")


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b'{"model": "tiny", "prompt": ', "not valid JSON"),
        (b"[1, 2, 3]", "must be a JSON object"),
        (b'{"prompt": "hi"}', "model: Field required"),
    ],
)
def test_malformed_body_400(served, body, needle):
    status, payload = post(served.base_url, "/v1/completions", body)
    assert status == 400 and needle in payload["error"]["message"], payload


def test_body_size_limit_413(served):
    body = json.dumps({"model": MODEL_NAME, "prompt": "x" * (2 << 20)}).encode()
    status, payload = post(served.base_url, "/v1/completions", body)
    assert status == 413 and "larger than this server's limit" in payload["error"]["message"]


def test_overloaded_503_then_recovers(tiny_model):
    """A bounded queue: with 1 running + 1 waiting admitted, a third concurrent request gets 503."""
    from keel.entrypoints.openai.server_config import ServerConfig

    served = start_server(tiny_model, engine_kwargs={"max_num_seqs": 1}, limits=ServerConfig(max_waiting=1))
    control = StepControl(served.engine.engine)
    try:
        control.pause()  # the first step blocks: both admitted requests stay in flight
        results: list = []
        kw = dict(model=MODEL_NAME, prompt="hi", max_tokens=4, temperature=0)
        workers = [
            threading.Thread(target=lambda: results.append(served.client().completions.create(**kw))) for _ in range(2)
        ]
        for w in workers:
            w.start()
        deadline = time.monotonic() + 10
        while served.engine.num_open < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(openai.APIStatusError) as info:  # a timeout (not admitted: waits) fails this too
            served.client(timeout=10).completions.create(**kw)
        assert info.value.status_code == 503 and "overloaded" in error_of(info.value)["message"]
        control.resume()
        for w in workers:
            w.join(30)
        assert len(results) == 2
        served.client().completions.create(**kw)  # admitted again once the queue drained
        assert served.metrics()["keel_request_rejected_total"] == 1
    finally:
        control.restore()
        served.stop()


def test_api_key_required_on_v1(tiny_model):
    served = start_server(tiny_model, api_key="s3cret")
    try:
        with pytest.raises(openai.AuthenticationError) as info:
            served.client(api_key="wrong").models.list()
        assert error_of(info.value)["code"] == "invalid_api_key"
        assert [m.id for m in served.client(api_key="s3cret").models.list().data] == [MODEL_NAME]
        with urllib.request.urlopen(served.base_url + "/health", timeout=10) as resp:  # probes need no key
            assert resp.status == 200
    finally:
        served.stop()


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20", "::", "example.com"])
def test_bind_beyond_loopback_needs_api_key(host, capsys):
    from keel.cli import main
    from keel.entrypoints.openai.api_server import check_bind

    assert main(["serve", "--host", host, "--model", "/nonexistent"]) == 1
    assert "set --api-key" in capsys.readouterr().err
    check_bind(host, "some-key")  # allowed with a key
    for loopback in ("127.0.0.1", "localhost", "::1", "127.0.0.5"):
        check_bind(loopback, None)
