"""What each real client does against a running `keel serve` (the client test modules run these against their own
server): the `openai` SDK's Responses calls, an OpenAI Agents SDK agent, the `anthropic` SDK's Messages calls and
the Vercel AI SDK's generateText (node). Tool calls are made with tool_choice required / any, so the grammar engine
makes any model, random or real, write a valid call; the round trips then send the call's result back."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Literal

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ROOT / "tests" / "entrypoints" / "clients"  # the node client and its package lock
NODE_CLIENTS = Path(os.environ.get("KEEL_NODE_CLIENTS", ROOT / ".cache" / "node-clients"))
CITY = {"type": "string", "enum": ["Paris", "Oslo"]}  # an enum keeps a random model's call short
WEATHER_PARAMS = {"type": "object", "properties": {"city": CITY}, "required": ["city"], "additionalProperties": False}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city",
    "parameters": WEATHER_PARAMS,
}
ANSWER = {
    "type": "object",
    "properties": {"city": CITY, "sunny": {"type": "boolean"}},
    "required": ["city", "sunny"],
    "additionalProperties": False,
}
QUESTION = "What is the weather in Paris?"
CALL_TEXT = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def start_scripted_tools(tool_model: Path, pieces: list[str]) -> Any:
    """A real server over a scripted engine that writes `pieces`, with the Hermes tools template."""
    from keel.engine.async_engine import AsyncEngine
    from keel.entrypoints.openai.api_server import ServerThread, build_app
    from keel.entrypoints.openai.server_config import ServerConfig
    from support.scripted_engine import ScriptedEngine
    from support.serve import MODEL_NAME, Served, make_engine

    engine = AsyncEngine(ScriptedEngine(make_engine(tool_model), pieces), max_admitted=64)
    app = build_app(engine, model_name=MODEL_NAME, limits=ServerConfig(max_tokens=512))
    return Served(ServerThread(app).start(), engine)


def responses_plain(client: Any, model: str) -> Any:
    r = client.responses.create(
        model=model, input="What is the capital of France?", max_output_tokens=12, temperature=0
    )
    assert r.object == "response" and r.status in ("completed", "incomplete") and r.id.startswith("resp_")
    (message,) = r.output
    assert message.type == "message" and message.role == "assistant" and message.content[0].type == "output_text"
    assert r.output_text == message.content[0].text and r.output_text
    assert 0 < r.usage.output_tokens <= 12 and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    return r


def responses_streamed(client: Any, model: str, whole: Any) -> None:
    """Streamed: the events in OpenAI's order, their deltas the text of `whole` (the same request, greedy)."""
    kinds, deltas, final = [], [], None
    for event in client.responses.create(
        model=model, input="What is the capital of France?", max_output_tokens=12, temperature=0, stream=True
    ):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert final is not None and final.output_text == "".join(deltas) and len(deltas) >= 2
    assert final.output_text == whole.output_text


def responses_json_schema(client: Any, model: str) -> None:
    fmt = {"type": "json_schema", "name": "weather", "schema": ANSWER, "strict": True}
    r = client.responses.create(model=model, input=QUESTION, text={"format": fmt}, max_output_tokens=64, temperature=0)
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), ANSWER)


def responses_tool_round_trips(client: Any, model: str) -> None:
    """A call, its result sent back by previous_response_id and by passing the items by hand: the same prompt."""
    first = client.responses.create(
        model=model,
        input=QUESTION,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,  # one call: a random model would go on calling until the token limit
        store=True,
        max_output_tokens=64,
        temperature=0,
    )
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert json.loads(call.arguments)["city"] in CITY["enum"] and call.call_id
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "18 C and sunny"}
    chained = client.responses.create(
        model=model, previous_response_id=first.id, input=[result], tools=[WEATHER], max_output_tokens=8, temperature=0
    )
    items = [{"role": "user", "content": QUESTION}, *[o.model_dump(exclude_none=True) for o in first.output], result]
    by_hand = client.responses.create(model=model, input=items, tools=[WEATHER], max_output_tokens=8, temperature=0)
    for r in (chained, by_hand):
        assert r.status in ("completed", "incomplete") and r.output[0].type == "message"
        assert r.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens // 2
    assert chained.usage.input_tokens == by_hand.usage.input_tokens and chained.output_text == by_hand.output_text
    assert chained.previous_response_id == first.id
    assert client.responses.retrieve(first.id).output[0].call_id == call.call_id
    client.responses.delete(first.id)
    with pytest.raises(Exception, match="not found"):
        client.responses.retrieve(first.id)


def agent_runs_to_completion(base_url: str, model: str) -> None:
    """An OpenAI Agents SDK agent with one function tool, to its final output (its documented custom client)."""
    import openai
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from pydantic import BaseModel

    class Report(BaseModel):  # the final turn's structured output: even a random model's answer ends
        city: Literal["Paris", "Oslo"]
        sunny: bool

    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Oslo"]) -> str:
        """Current weather of a city."""
        calls.append(city)
        return f"18 C and sunny in {city}"

    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
    agent = Agent(
        name="weather",
        instructions="Answer with the weather.",
        tools=[get_weather],
        output_type=Report,
        model=OpenAIResponsesModel(model=model, openai_client=client),
        model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=96),
    )
    result = asyncio.run(Runner.run(agent, QUESTION, max_turns=3))
    assert len(calls) == 1 and calls[0] in CITY["enum"]  # required, then (reset_tool_choice) the model's own turn
    kinds = [item.type for item in result.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item", "message_output_item"]
    assert isinstance(result.final_output, Report)


def messages_plain_and_streamed(client: Any, model: str) -> None:
    kw: dict[str, Any] = dict(
        model=model, max_tokens=12, messages=[{"role": "user", "content": "What is the capital of France?"}]
    )
    m = client.messages.create(**kw, extra_body={"temperature": 0})
    assert m.type == "message" and m.role == "assistant" and m.stop_reason in ("end_turn", "max_tokens")
    (block,) = m.content
    assert block.type == "text" and block.text and 0 < m.usage.output_tokens <= 12
    with client.messages.stream(**kw, extra_body={"temperature": 0}) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == block.text == final.content[0].text and final.usage.output_tokens == m.usage.output_tokens
    counted = client.messages.count_tokens(model=model, messages=kw["messages"])
    assert counted.input_tokens == m.usage.input_tokens


def messages_tool_round_trip(client: Any, model: str) -> None:
    tool = {"name": "get_weather", "description": "Current weather of a city", "input_schema": WEATHER_PARAMS}
    question = [{"role": "user", "content": QUESTION}]
    m = client.messages.create(
        model=model,
        max_tokens=64,
        messages=question,
        tools=[tool],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        extra_body={"temperature": 0},
    )
    assert m.stop_reason == "tool_use"
    (use,) = [b for b in m.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input["city"] in CITY["enum"] and use.id
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "18 C and sunny"}
    conversation = [*question, {"role": "assistant", "content": m.content}, {"role": "user", "content": [result]}]
    answer = client.messages.create(
        model=model, max_tokens=8, messages=conversation, tools=[tool], extra_body={"temperature": 0}
    )
    assert answer.stop_reason in ("end_turn", "max_tokens") and answer.content[0].type == "text"
    counted = client.messages.count_tokens(model=model, messages=conversation, tools=[tool])
    assert counted.input_tokens == answer.usage.input_tokens > m.usage.input_tokens


def vercel_generate_text(base_url: str, model: str) -> dict[str, Any]:
    """The Vercel AI SDK's generateText through Responses (tests/entrypoints/clients/generate_text.mjs)."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (Debian's nodejs): the Vercel AI SDK client cannot run")
    if not (NODE_CLIENTS / "node_modules" / "ai").is_dir():
        pytest.skip(f"the Vercel AI SDK is not installed in {NODE_CLIENTS} (scripts/test.sh installs it with npm)")
    source = (CLIENTS / "generate_text.mjs").read_text()
    env = {**os.environ, "KEEL_BASE_URL": base_url + "/v1", "KEEL_MODEL": model}
    # run from the install folder: an ES module finds its packages from where it runs, not from NODE_PATH
    cmd = [node, "--input-type=module", "-e", source]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=NODE_CLIENTS)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["plain"]["text"] and out["plain"]["finishReason"] in ("stop", "length")
    assert out["plain"]["usage"]["outputTokens"] > 0
    steps = out["tools"]["steps"]
    assert [s["finishReason"] for s in steps] == ["tool-calls", "tool-calls"]  # required on every step
    assert all(s["toolCalls"][0]["toolName"] == "get_weather" for s in steps)
    assert steps[0]["toolResults"][0]["output"].startswith("18 C")
    return out
