"""Hostile request bodies that the server probe (benchmarks/probe/serve.py) and the server tests share."""

from __future__ import annotations

import json

SURROGATE = '"\\ud800"'  # JSON's escape of a lone UTF-16 surrogate: valid JSON, not valid Unicode

# (route, body with `%s` where the surrogate goes and `{model}` for the served model's name, the field the 400
# must name)
_SURROGATE_BODIES = [
    ("/v1/completions", '{"model": %s, "prompt": "hi", "max_tokens": 1}', "model"),
    ("/v1/completions", '{"model": {model}, "prompt": %s, "max_tokens": 1}', "prompt"),
    (
        "/v1/chat/completions",
        '{"model": {model}, "messages": [{"role": "user", "content": %s}], "max_tokens": 1}',
        "messages.0.content",
    ),
    ("/v1/chat/completions", '{"model": %s, "messages": [{"role": "user", "content": "hi"}]}', "model"),
    ("/tokenize", '{"prompt": %s}', "prompt"),
    ("/tokenize", '{"model": {model}, "messages": [{"role": "user", "content": %s}]}', "messages.0.content"),
    ("/detokenize", '{"model": %s, "tokens": [1]}', "model"),
    ("/v1/completions", '{"model": {model}, "prompt": "hi", "stop": [%s]}', "stop.0"),
    ("/v1/completions", '{"model": {model}, "prompt": "hi", "logit_bias": {%s: 1}}', "logit_bias.<key>"),
]


def surrogate_cases(model: str) -> list[tuple[str, bytes, str]]:
    """Bodies with a lone surrogate in one field each, as (route, raw JSON bytes, the field a 400 must name)."""
    name = json.dumps(model)
    return [
        (route, (body.replace("{model}", name) % SURROGATE).encode(), param) for route, body, param in _SURROGATE_BODIES
    ]
