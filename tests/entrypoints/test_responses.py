"""`/v1/responses` through the openai SDK: what it refuses (400 naming the field), the store (GET / DELETE / cancel by
id, chaining, its size and age bounds), the token limit, and tool_choice auto read as Hermes calls from a scripted
model's text, whole and streamed (arguments as they are written)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from support.clients import CALL_TEXT, start_scripted_tools
from support.serve import MODEL_NAME, Served, StepControl, needs_ops, start_server

from keel.entrypoints.openai.responses.store import ResponseStore, Stored

pytestmark = needs_ops

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {  # an enum keeps a random model's forced call short
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def server(tool_model: Path) -> Iterator[Served]:
    from keel.entrypoints.openai.server_config import ServerConfig

    s = start_server(tool_model, limits=ServerConfig(max_tokens=512, response_store_mib=1))
    yield s
    s.stop()


@pytest.mark.parametrize(
    ("kwargs", "param", "needle"),
    [
        (
            dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
            "input.0.content.0.type",
            "takes text",
        ),
        (dict(input=[{"type": "web_search_call", "id": "ws_1"}]), "input.0.type", "not supported"),
        (dict(input="hi", tools=[{"type": "web_search"}]), "tools.0.type", "function tools only"),
        (dict(input="hi", extra_body={"background": True}), None, "no background responses"),
        (dict(input="hi", truncation="auto"), None, "does not drop input items"),
        (dict(input="hi", tools=[WEATHER], tool_choice={"type": "function", "name": "nope"}), None, "not in tools"),
        (dict(input="hi", previous_response_id="resp_unknown"), "previous_response_id", "not found"),
        (dict(input=[{"type": "item_reference", "id": "msg_unknown"}]), "input.0.id", "no stored item"),
        (dict(input="hi", max_output_tokens=100_000), "max_output_tokens", "allows at most 512"),
        (dict(input="hi", model="other"), "model", "does not exist"),
        (
            dict(input="hi", text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}),
            "text.format",
            "",
        ),
        (dict(input="hi", extra_body={"bogus": 1}), "bogus", "not a supported parameter"),
    ],
)
def test_refused_with_the_field_named(server, kwargs, param, needle):
    kwargs.setdefault("model", MODEL_NAME)
    with pytest.raises(openai.APIStatusError) as info:
        server.client().responses.create(**kwargs)
    assert info.value.status_code == (404 if param == "model" else 400)
    body = info.value.body
    assert isinstance(body, dict) and needle in body["message"] and body["param"] == param, body


def test_store_get_delete_and_chain(server):
    client = server.client()
    stateless = client.responses.create(model=MODEL_NAME, input="hi", max_output_tokens=3, temperature=0)
    assert stateless.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(stateless.id)  # stateless by default: nothing kept
    first = client.responses.create(model=MODEL_NAME, input="hi", max_output_tokens=3, temperature=0, store=True)
    assert first.status == "incomplete" and first.incomplete_details.reason == "max_output_tokens"
    assert client.responses.retrieve(first.id).output_text == first.output_text
    second = client.responses.create(
        model=MODEL_NAME, previous_response_id=first.id, input="again", max_output_tokens=3, temperature=0, store=True
    )
    whole = [
        {"role": "user", "content": "hi"},
        first.output[0].model_dump(exclude_none=True),
        {"role": "user", "content": "again"},
    ]
    by_hand = client.responses.create(model=MODEL_NAME, input=whole, max_output_tokens=3, temperature=0)
    assert second.usage.input_tokens == by_hand.usage.input_tokens and second.output_text == by_hand.output_text
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    third = client.responses.create(  # the second holds its whole conversation: deleting the first breaks nothing
        model=MODEL_NAME, previous_response_id=second.id, input="more", max_output_tokens=3, temperature=0
    )
    assert third.usage.input_tokens > second.usage.input_tokens
    with pytest.raises(openai.BadRequestError, match="only a response in progress"):
        client.responses.cancel(second.id)


def test_cancel_a_response_in_progress(server):
    client, control = server.client(), StepControl(server.engine.engine)
    control.pause()
    answer: dict = {}
    try:
        worker = threading.Thread(
            target=lambda: answer.update(
                r=client.responses.create(model=MODEL_NAME, input="hi", max_output_tokens=50, store=True, temperature=0)
            )
        )
        worker.start()
        stored = _wait_for_in_progress(server)
        cancelled = client.responses.cancel(stored)
        assert cancelled.status == "cancelled"
    finally:
        control.restore()
    worker.join(30)
    assert answer["r"].status == "cancelled" and answer["r"].id == stored
    assert client.responses.retrieve(stored).status == "cancelled"
    server.wait_idle()


def _wait_for_in_progress(server: Served) -> str:
    import time

    store = server.thread.app.app.state.responses.store
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        running = [k for k, e in list(store._entries.items()) if e.in_progress]
        if running:
            return running[0]
        time.sleep(0.02)
    raise AssertionError("no stored response in progress")


def test_store_bounds_size_and_age():
    now = [0.0]
    store = ResponseStore(max_bytes=100, max_age_s=10, clock=lambda: now[0])
    for i in range(3):
        assert store.put(f"r{i}", Stored({"status": "completed"}, [], 40))
    assert store.get("r0") is None and store.get("r1") and store.get("r2") and store.bytes == 80  # oldest went first
    assert not store.put("big", Stored({}, [], 101))  # larger than the store: not kept
    now[0] = 10.5
    store.put("r3", Stored({}, [], 10))
    assert store.get("r1") is None and store.get("r2") is None and store.get("r3") is not None  # too old
    assert store.bytes == 10


def test_store_refused_when_the_server_keeps_none(tool_model):
    from keel.entrypoints.openai.server_config import ServerConfig

    s = start_server(tool_model, limits=ServerConfig(max_tokens=64, response_store_mib=0))
    try:
        with pytest.raises(openai.BadRequestError, match="--response-store-mib 0"):
            s.client().responses.create(model=MODEL_NAME, input="hi", store=True, max_output_tokens=2)
    finally:
        s.stop()


def test_tool_choice_auto_reads_hermes_calls_whole_and_streamed(tool_model):
    pieces = [CALL_TEXT[i : i + 3] for i in range(0, len(CALL_TEXT), 3)]
    s = start_scripted_tools(tool_model, pieces)
    try:
        client = s.client()
        r = client.responses.create(model=MODEL_NAME, input="Weather in Paris?", tools=[WEATHER])
        message, call = r.output
        assert message.type == "message" and message.content[0].text == "Let me check."
        assert (
            call.type == "function_call"
            and call.name == "get_weather"
            and json.loads(call.arguments) == {"city": "Paris"}
        )
        events = list(
            client.responses.create(model=MODEL_NAME, input="Weather in Paris?", tools=[WEATHER], stream=True)
        )
        kinds = [e.type for e in events]
        assert kinds.count("response.function_call_arguments.delta") >= 3  # as written, not in one piece
        assert [e.sequence_number for e in events] == list(range(len(events)))
        added = [e.item.type for e in events if e.type == "response.output_item.added"]
        assert added == ["message", "function_call"] and kinds[-1] == "response.completed"
        args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert json.loads(args) == {"city": "Paris"} and done.arguments == args
        final = events[-1].response
        assert final.output[0].content[0].text == "Let me check." and final.output[1].arguments == args
    finally:
        s.stop()


def test_a_forced_call_replaces_the_text_format(server):
    """tool_choice required writes a call, not text: the call's schema applies, not text.format / response_format
    (what an agent with a structured final answer sends on its tool turns)."""
    client, fmt = server.client(), {"type": "json_schema", "name": "x", "schema": {"type": "object"}}
    kw = dict(model=MODEL_NAME, temperature=0, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    r = client.responses.create(**kw, input="hi", text={"format": fmt}, max_output_tokens=200)
    assert [o.type for o in r.output] == ["function_call"] and r.output[0].name == "get_weather"
    chat_tool = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    c = client.chat.completions.create(
        **{**kw, "tools": [chat_tool]},
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=200,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
    )
    assert c.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_a_stream_the_client_leaves_is_stored_as_cancelled(server):
    import time

    client, control = server.client(), StepControl(server.engine.engine)
    control.pause()  # the engine holds the response in progress
    try:
        stream = client.responses.create(model=MODEL_NAME, input="hi", max_output_tokens=50, store=True, stream=True)
        first = next(iter(stream))
        assert first.type == "response.created" and first.response.status == "in_progress"
        stream.close()
        deadline = time.monotonic() + 30
        while client.responses.retrieve(first.response.id).status == "in_progress" and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        control.restore()
    assert client.responses.retrieve(first.response.id).status == "cancelled"
    server.wait_idle()
