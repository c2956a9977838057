"""Tools in chat completions: tool_choice auto through the server and the openai client (a scripted engine writes a
Hermes call; its arguments stream as they come), tool results rendered back through a template. The parsers' own
format tests are test_tool_parsers.py."""

from __future__ import annotations

import json
import random

import openai
import pytest
from support.scripted_engine import start_scripted
from support.serve import MODEL_NAME, needs_ops

# A Hermes-style template (the shape of Qwen2.5's): tools in a system block, calls as <tool_call> JSON,
# tool results as <tool_response> in a user turn.
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools><|im_end|>\n"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n"
    '{% for c in m.tool_calls %}<tool_call>\n{"name": "{{ c.function.name }}", "arguments": '
    "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL_TEXT = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def pieces(text: str, seed: int = 0) -> list[str]:
    """`text` cut at random places (1-5 characters), as a tokenizer's deltas would come."""
    rng, out, i = random.Random(seed), [], 0
    while i < len(text):
        n = rng.randint(1, 5)
        out.append(text[i : i + n])
        i += n
    return out


@needs_ops
def test_tool_choice_auto_through_the_openai_client(tiny_model):
    served, fake = start_scripted(tiny_model, pieces(CALL_TEXT))
    try:
        client = served.client()
        kw = dict(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[WEATHER],
            extra_body={"chat_template": TOOLS_TEMPLATE},
        )
        r = client.chat.completions.create(**kw)
        (choice,) = r.choices
        assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check."
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
        assert json.loads(call.function.arguments) == {"city": "Paris"}

        content, calls, finish, arg_chunks = [], {}, None, 0
        for chunk in client.chat.completions.create(**kw, stream=True):
            for c in chunk.choices:
                content.append(c.delta.content or "")
                for tc in c.delta.tool_calls or []:
                    slot = calls.setdefault(tc.index, {"name": "", "arguments": "", "id": None})
                    slot["id"] = slot["id"] or tc.id
                    slot["name"] += tc.function.name or ""
                    slot["arguments"] += tc.function.arguments or ""
                    arg_chunks += bool(tc.function.arguments)
                finish = c.finish_reason or finish
        assert arg_chunks >= 3  # the arguments stream as the model writes them, not in one piece at the end
        assert "".join(content) == "Let me check." and finish == "tool_calls"
        assert [(v["name"], json.loads(v["arguments"])) for v in calls.values()] == [("get_weather", {"city": "Paris"})]
        assert calls[0]["id"].startswith("call_")

        # the model's own template shows no tool-call format: auto has no parser -> 400, not a silent miss
        with pytest.raises(openai.BadRequestError, match="--tool-call-parser"):
            client.chat.completions.create(model=MODEL_NAME, messages=kw["messages"], tools=[WEATHER])
    finally:
        served.stop()


@needs_ops
def test_tool_results_render_back_through_the_template(tiny_model):
    """An assistant tool call and the tool's answer go back through the template (arguments as an object)."""
    import urllib.request

    served, _ = start_scripted(tiny_model, ["ok"])
    try:
        messages = [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
        ]
        body = {"model": MODEL_NAME, "messages": messages, "tools": [WEATHER], "chat_template": TOOLS_TEMPLATE}
        body["return_token_strs"] = True
        req = urllib.request.Request(
            served.base_url + "/tokenize", json.dumps(body).encode(), {"content-type": "application/json"}
        )
        out = json.loads(urllib.request.urlopen(req, timeout=10).read())
        text = "".join(out["token_strs"])
        assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in text  # arguments rendered as JSON
        assert "<tool_response>\n18 C, sunny\n</tool_response>" in text and '"name": "get_weather"' in text
        r = served.client().chat.completions.create(
            model=MODEL_NAME, messages=messages, tools=[WEATHER], extra_body={"chat_template": TOOLS_TEMPLATE}
        )
        assert r.usage.prompt_tokens == out["count"] and r.choices[0].message.content == "ok"
    finally:
        served.stop()
