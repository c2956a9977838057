"""`/v1/messages` through the anthropic SDK and raw HTTP: the API key as `x-api-key` or Bearer, errors in
Anthropic's body, the event sequence with its ping, the stop sequence named, count_tokens, and tool_choice auto read
as Hermes calls from a scripted model's text (tool_use blocks, input_json_delta as the arguments are written)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest
from support.clients import CALL_TEXT, start_scripted_tools
from support.serve import MODEL_NAME, Served, needs_ops, start_server

pytestmark = needs_ops

KEY = "test-key"
USER = [{"role": "user", "content": "Hello there"}]
TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


@pytest.fixture(scope="module")
def server(tool_model: Path) -> Iterator[Served]:
    from keel.entrypoints.openai.server_config import ServerConfig

    s = start_server(tool_model, limits=ServerConfig(max_tokens=512), api_key=KEY)
    yield s
    s.stop()


def client(server: Served, **kw) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0, **kw)


def raw_post(server: Served, path: str, body: dict, headers: dict) -> tuple[int, str]:
    req = urllib.request.Request(
        server.base_url + path, json.dumps(body).encode(), {"content-type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_api_key_as_x_api_key_or_bearer(server):
    body = {"model": MODEL_NAME, "max_tokens": 2, "messages": USER}
    for headers in ({"x-api-key": KEY}, {"authorization": f"Bearer {KEY}"}):
        assert raw_post(server, "/v1/messages", body, headers)[0] == 200
    status, text = raw_post(server, "/v1/messages", body, {"x-api-key": "wrong"})
    assert status == 401 and json.loads(text)["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.base_url, api_key="wrong", max_retries=0).messages.create(
            model=MODEL_NAME, max_tokens=2, messages=USER
        )


@pytest.mark.parametrize(
    ("kwargs", "status", "kind", "needle"),
    [
        (dict(model="other"), 404, "not_found_error", "does not exist"),
        (dict(max_tokens=5000), 400, "invalid_request_error", "max_tokens"),
        (
            dict(messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]),
            400,
            "invalid_request_error",
            "messages.0.content.0.type",
        ),
        (
            dict(tools=[{"type": "web_search_20250305", "name": "web_search"}]),
            400,
            "invalid_request_error",
            "server tool",
        ),
        (
            dict(tool_choice={"type": "tool", "name": "nope"}, tools=[TOOL]),
            400,
            "invalid_request_error",
            "not in tools",
        ),
        (dict(extra_body={"temperature": 1.5}), 400, "invalid_request_error", "temperature"),
        (dict(extra_body={"bogus": 1}), 400, "invalid_request_error", "bogus"),
    ],
)
def test_errors_in_anthropic_shape(server, kwargs, status, kind, needle):
    kw = {"model": MODEL_NAME, "max_tokens": 4, "messages": USER, **kwargs}
    with pytest.raises(anthropic.APIStatusError) as info:
        client(server).messages.create(**kw)
    body = info.value.body
    assert info.value.status_code == status and body["type"] == "error", body
    assert body["error"]["type"] == kind and needle in body["error"]["message"], body


def test_stream_events_and_the_stop_sequence_named(server):
    c = client(server)
    greedy = c.messages.create(model=MODEL_NAME, max_tokens=24, messages=USER, extra_body={"temperature": 0})
    text = greedy.content[0].text
    at = next(i for i in range(4, len(text) - 2) if "\ufffd" not in text[i : i + 2])
    stop = text[at : at + 2]  # a piece of what the model writes greedily: it stops there, and says which one
    kw = dict(model=MODEL_NAME, max_tokens=24, messages=USER, stop_sequences=["\x00never", stop])
    m = c.messages.create(**kw, extra_body={"temperature": 0})
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert m.content[0].text == text[: text.index(stop)]
    status, sse = raw_post(server, "/v1/messages", {**kw, "temperature": 0, "stream": True}, {"x-api-key": KEY})
    events = [json.loads(line[6:]) for line in sse.splitlines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["message_start", "ping", "content_block_start"] and kinds[-2:] == [
        "message_delta",
        "message_stop",
    ]
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": stop}
    streamed = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert streamed == m.content[0].text and events[0]["message"]["usage"]["input_tokens"] == m.usage.input_tokens


def test_count_tokens_is_the_prompt_a_message_runs(server):
    c = client(server)
    messages = [*USER, {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Weather?"}]
    counted = c.messages.count_tokens(model=MODEL_NAME, messages=messages, system="Be brief.", tools=[TOOL])
    m = c.messages.create(
        model=MODEL_NAME,
        max_tokens=1,
        messages=messages,
        system="Be brief.",
        tools=[TOOL],
        tool_choice={"type": "none"},
    )
    assert counted.input_tokens == m.usage.input_tokens and counted.input_tokens > 20


def test_tool_choice_auto_reads_hermes_calls_as_tool_use(tool_model):
    pieces = [CALL_TEXT[i : i + 3] for i in range(0, len(CALL_TEXT), 3)]
    s = start_scripted_tools(tool_model, pieces)
    try:
        c = anthropic.Anthropic(base_url=s.base_url, api_key="unused", max_retries=0)
        m = c.messages.create(model=MODEL_NAME, max_tokens=200, messages=USER, tools=[TOOL])
        assert m.stop_reason == "tool_use"
        text, use = m.content
        assert text.text == "Let me check." and use.name == "get_weather" and use.input == {"city": "Paris"}
        with c.messages.stream(model=MODEL_NAME, max_tokens=200, messages=USER, tools=[TOOL]) as stream:
            events = list(stream)
            final = stream.get_final_message()
        partial = [e for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
        assert len(partial) >= 3 and json.loads("".join(e.delta.partial_json for e in partial)) == {"city": "Paris"}
        assert [b.type for b in final.content] == ["text", "tool_use"] and final.content[1].input == {"city": "Paris"}
        assert final.stop_reason == "tool_use"
    finally:
        s.stop()


def test_a_final_assistant_message_is_continued(server):
    """Anthropic's prefill: the answer continues the last assistant message (chat's continue_final_message)."""
    convo = [*USER, {"role": "assistant", "content": "The answer is"}]
    m = client(server).messages.create(model=MODEL_NAME, max_tokens=2, messages=convo)
    chat = server.client(api_key=KEY).chat.completions.create(
        model=MODEL_NAME,
        messages=convo,
        max_tokens=2,
        extra_body={"continue_final_message": True, "add_generation_prompt": False},
    )
    assert m.usage.input_tokens == chat.usage.prompt_tokens
    assert client(server).messages.count_tokens(model=MODEL_NAME, messages=convo).input_tokens == m.usage.input_tokens
