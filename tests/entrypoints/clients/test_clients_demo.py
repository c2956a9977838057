"""The real clients (openai's Responses, the OpenAI Agents SDK, anthropic's Messages, the Vercel AI SDK) against
keel serve with the demo model, the real SmolLM2-135M-Instruct from its GGUF: greedy answers name Paris. Its chat
template renders no tools, so the server reads tool_choice auto's output as hermes (--tool-call-parser): the
agent's last turn has tools and no forced choice."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import clients as scenarios
from support.serve import MODEL_NAME, Served, needs_ops, start_server

pytestmark = [needs_ops, pytest.mark.slow]  # the real 135M model


@pytest.fixture(scope="module")
def server(smollm2_fp32: Path) -> Iterator[Served]:
    from keel.entrypoints.openai.server_config import ServerConfig

    s = start_server(smollm2_fp32, limits=ServerConfig(max_tokens=512, tool_call_parser="hermes"))
    yield s
    s.stop()


def test_openai_responses(server):
    client = server.client()
    whole = scenarios.responses_plain(client, MODEL_NAME)
    assert "Paris" in whole.output_text
    scenarios.responses_streamed(client, MODEL_NAME, whole)
    scenarios.responses_json_schema(client, MODEL_NAME)
    scenarios.responses_tool_round_trips(client, MODEL_NAME)


def test_openai_agents_sdk(server):
    scenarios.agent_runs_to_completion(server.base_url, MODEL_NAME)


def test_anthropic_messages(server):
    import anthropic

    client = anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)
    scenarios.messages_plain_and_streamed(client, MODEL_NAME)
    scenarios.messages_tool_round_trip(client, MODEL_NAME)


def test_vercel_ai_sdk(server):
    out = scenarios.vercel_generate_text(server.base_url, MODEL_NAME)
    assert "Paris" in out["plain"]["text"]
