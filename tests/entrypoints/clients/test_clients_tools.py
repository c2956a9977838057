"""The real clients (openai's Responses, the OpenAI Agents SDK, anthropic's Messages, the Vercel AI SDK) against
keel serve over a tiny random checkpoint whose chat template renders tools and tool calls (Hermes / Qwen2.5's
shape): tools reach the prompt, calls and their results render back through the template."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import clients as scenarios
from support.serve import MODEL_NAME, Served, needs_ops, start_server

pytestmark = needs_ops


@pytest.fixture(scope="module")
def server(tool_model: Path) -> Iterator[Served]:
    from keel.entrypoints.openai.server_config import ServerConfig

    s = start_server(tool_model, limits=ServerConfig(max_tokens=512))
    yield s
    s.stop()


def test_openai_responses(server):
    client = server.client()
    scenarios.responses_streamed(client, MODEL_NAME, scenarios.responses_plain(client, MODEL_NAME))
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
    scenarios.vercel_generate_text(server.base_url, MODEL_NAME)
