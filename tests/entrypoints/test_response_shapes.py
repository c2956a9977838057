"""How the server shapes what the engine returns (a scripted engine: invented logprobs, real server,
real openai client): OpenAI's chat and completions logprobs, echo, vLLM's prompt_logprobs, streams equal
to whole answers, usage in every chunk (continuous_usage_stats), best_of, and which SamplingParams each
OpenAI / vLLM request field becomes."""

from __future__ import annotations

import json
import math

import pytest
from support.scripted_engine import start_scripted
from support.serve import MODEL_NAME, needs_ops

pytestmark = needs_ops

PIECES = ["Hel", "lo", " wor", "ld", "é", "!"]
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def scripted(tiny_model):
    served, fake = start_scripted(tiny_model, PIECES)
    yield served, fake
    served.stop()


def test_chat_logprobs_shape(scripted):
    served, _ = scripted
    r = served.client().chat.completions.create(model=MODEL_NAME, messages=MESSAGES, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert [c.token for c in content] == PIECES and r.choices[0].message.content == "".join(PIECES)
    for c in content:
        assert c.logprob == -0.5 and c.bytes == list(c.token.encode())
        assert [t.token for t in c.top_logprobs] == ["<alt1>", c.token, "<alt3>"]  # rank order, k entries
        assert [t.logprob for t in c.top_logprobs] == sorted((t.logprob for t in c.top_logprobs), reverse=True)
    zero = served.client().chat.completions.create(model=MODEL_NAME, messages=MESSAGES, logprobs=True)
    assert all(c.top_logprobs == [] for c in zero.choices[0].logprobs.content)  # top_logprobs 0: none listed
    plain = served.client().chat.completions.create(model=MODEL_NAME, messages=MESSAGES)
    assert plain.choices[0].logprobs is None


def test_chat_stream_logprobs_and_continuous_usage(scripted):
    served, _ = scripted
    chunks = list(
        served.client().chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}],  # list-of-parts content
            max_completion_tokens=32,
            logprobs=True,
            top_logprobs=2,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            extra_body={"ignore_eos": True},
        )
    )
    assert all(c.usage is not None for c in chunks)  # usage in every chunk
    completion = [c.usage.completion_tokens for c in chunks]
    assert completion == sorted(completion) and completion[-1] == len(PIECES)
    tokens = [t.token for c in chunks for ch in c.choices if ch.logprobs for t in ch.logprobs.content]
    assert tokens == PIECES
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == chunks[-1].usage.prompt_tokens + len(PIECES)


def test_completion_logprobs_shape_and_stream(scripted):
    served, _ = scripted
    client = served.client()
    r = client.completions.create(model=MODEL_NAME, prompt="hi", logprobs=2, max_tokens=16)
    lp = r.choices[0].logprobs
    assert lp.tokens == PIECES and lp.token_logprobs == [-0.5] * len(PIECES)
    assert all(list(t) == [tok, "<alt1>"] for t, tok in zip(lp.top_logprobs, PIECES, strict=True))  # sampled + top 2
    assert lp.text_offset == [sum(len(p) for p in PIECES[:i]) for i in range(len(PIECES))]
    chunks = list(client.completions.create(model=MODEL_NAME, prompt="hi", logprobs=2, max_tokens=16, stream=True))
    streamed = {"tokens": [], "text_offset": [], "top_logprobs": []}
    for c in chunks:
        if c.choices and c.choices[0].logprobs:
            for key in streamed:
                streamed[key] += getattr(c.choices[0].logprobs, key)
    assert streamed == {"tokens": lp.tokens, "text_offset": lp.text_offset, "top_logprobs": lp.top_logprobs}


def test_completion_echo_logprobs_and_prompt_logprobs(scripted, tiny_model):
    served, fake = scripted
    prompt = [5, 6, 7, 8]
    r = served.client().completions.create(
        model=MODEL_NAME, prompt=prompt, echo=True, logprobs=1, max_tokens=2, extra_body={"prompt_logprobs": 1}
    )
    choice = r.choices[0]
    tok = fake.tokenizer
    assert choice.text == tok.decode(prompt) + "".join(PIECES[:2])
    lp = choice.logprobs
    assert len(lp.tokens) == len(prompt) + 2 and lp.tokens[-2:] == PIECES[:2]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing predicts the first token
    assert lp.token_logprobs[1:] == [-0.5] * (len(prompt) + 1)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    plp = choice.model_extra["prompt_logprobs"]  # vLLM's shape
    assert plp[0] is None and len(plp) == len(prompt)
    assert plp[1][str(prompt[1])] == {"logprob": -0.5, "rank": 2, "decoded_token": tok.decode([prompt[1]])}
    params = fake.params_seen[-1]
    assert params.prompt_logprobs == 1 and params.logprobs == 1 and params.max_tokens == 2


def test_best_of_keeps_n_and_asks_for_logprobs(scripted):
    served, fake = scripted
    before = len(fake.params_seen)
    r = served.client().completions.create(model=MODEL_NAME, prompt="hi", n=1, best_of=3, max_tokens=4)
    assert len(r.choices) == 1 and r.choices[0].index == 0 and r.choices[0].logprobs is None
    seen = fake.params_seen[before:]
    assert len(seen) == 3 and all(p.logprobs == 0 for p in seen)  # ranking needs the sampled logprobs
    assert r.usage.completion_tokens == 3 * 4  # every candidate's tokens were generated


def post(served, path: str, body: dict) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        served.base_url + path, json.dumps(body).encode(), {"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"presence_penalty": 0.5, "frequency_penalty": -0.25}, {"presence_penalty": 0.5, "frequency_penalty": -0.25}),
        ({"logit_bias": {"7": 3.0}}, {"logit_bias": {7: 3.0}}),
        ({"min_p": 0.1, "min_tokens": 2, "top_k": -1}, {"min_p": 0.1, "min_tokens": 2, "top_k": 0}),
        (
            {"stop_token_ids": [3], "include_stop_str_in_output": True},
            {"stop_token_ids": [3], "include_stop_str_in_output": True},
        ),
        (
            {"skip_special_tokens": False, "spaces_between_special_tokens": False},
            {"skip_special_tokens": False, "spaces_between_special_tokens": False},
        ),
        ({"allowed_token_ids": [4, 5], "bad_words": ["x"]}, {"allowed_token_ids": [4, 5], "bad_words": ["x"]}),
        ({"response_format": {"type": "json_object"}}, {"structured_outputs": ("json_object", "True")}),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "s", "schema": SCHEMA, "strict": True},
                }
            },
            {"structured_outputs": ("json", json.dumps(SCHEMA, sort_keys=True))},
        ),
        ({"guided_json": json.dumps(SCHEMA)}, {"structured_outputs": ("json", json.dumps(SCHEMA, sort_keys=True))}),
        ({"guided_regex": "[ab]+"}, {"structured_outputs": ("regex", "[ab]+")}),
        ({"guided_choice": ["yes", "no"]}, {"structured_outputs": ("choice", '["yes", "no"]')}),
        ({"guided_grammar": 'start: "a"'}, {"structured_outputs": ("grammar", 'start: "a"')}),
        ({"structured_outputs": {"regex": "[0-9]+"}}, {"structured_outputs": ("regex", "[0-9]+")}),
    ],
)
@pytest.mark.parametrize("endpoint", ["/v1/chat/completions", "/v1/completions"])
def test_request_fields_become_sampling_params(scripted, endpoint, extra, expected):
    served, fake = scripted
    base = {"messages": MESSAGES} if "chat" in endpoint else {"prompt": "hi"}
    status, body = post(served, endpoint, {"model": MODEL_NAME, "max_tokens": 3, **base, **extra})
    assert status == 200, body
    params = fake.params_seen[-1]
    for name, value in expected.items():
        got = getattr(params, name)
        if name == "structured_outputs":
            got = got.key()
        assert got == value, (name, got)


@pytest.mark.parametrize(
    ("extra", "param", "needle"),
    [
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex", "one output constraint"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "response_format", "exactly one of"),
        ({"response_format": {"type": "xml"}}, "response_format", "must be one of text, json_object, json_schema"),
        ({"guided_json": "{not json"}, "response_format", "guided_json is not valid JSON"),
        ({"presence_penalty": 3}, "presence_penalty", "less than or equal to 2"),
        ({"top_logprobs": 3}, None, "top_logprobs needs logprobs: true"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "less than or equal to 20"),
        (
            {"stream_options": {"continuous_usage_stats": True}, "stream": True},
            None,
            "needs stream_options.include_usage",
        ),
        ({"tool_choice": "required"}, None, "tool_choice needs tools"),
        ({"continue_final_message": True}, "messages", "cannot both be true"),
        ({"chat_template_kwargs": {"messages": []}}, "messages", "may not set messages"),
        ({"allowed_token_ids": [1, 99999]}, "allowed_token_ids", "outside [0, 320)"),
        ({"priority": 1}, None, "no priority scheduling"),
        ({"bogus": 1}, "bogus", "not a supported parameter"),
    ],
)
def test_chat_fields_refused_with_reason(scripted, extra, param, needle):
    served, _ = scripted
    status, body = post(served, "/v1/chat/completions", {"model": MODEL_NAME, "messages": MESSAGES, **extra})
    err = body["error"]
    assert status == 400 and needle in err["message"] and err["param"] == param, err


def test_tool_choice_required_and_named_become_a_json_schema(scripted):
    served, fake = scripted
    tool = {"type": "function", "function": {"name": "f", "parameters": SCHEMA}}
    status, body = post(
        served,
        "/v1/chat/completions",
        {"model": MODEL_NAME, "messages": MESSAGES, "tools": [tool], "tool_choice": "required", "max_tokens": 2},
    )
    assert status == 200, body
    kind, schema = fake.params_seen[-1].structured_outputs.key()
    schema = json.loads(schema)
    assert (
        kind == "json"
        and schema["type"] == "array"
        and schema["items"]["anyOf"][0]["properties"]["parameters"] == SCHEMA
    )
    named = {"type": "function", "function": {"name": "f"}}
    status, body = post(
        served,
        "/v1/chat/completions",
        {"model": MODEL_NAME, "messages": MESSAGES, "tools": [tool], "tool_choice": named, "max_tokens": 2},
    )
    assert status == 200, body
    assert fake.params_seen[-1].structured_outputs.key() == ("json", json.dumps(SCHEMA, sort_keys=True))
    (call,) = body["choices"][0]["message"]["tool_calls"]  # the output is the named function's arguments
    assert (
        call["function"] == {"name": "f", "arguments": "".join(PIECES[:2])}
        and body["choices"][0]["message"]["content"] is None
    )


def test_chat_echo_continues_the_final_message(scripted):
    served, _ = scripted
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure:"}]
    status, body = post(
        served,
        "/v1/chat/completions",
        {
            "model": MODEL_NAME,
            "messages": messages,
            "echo": True,
            "add_generation_prompt": False,
            "continue_final_message": True,
            "max_tokens": 2,
        },
    )
    assert status == 200, body
    assert body["choices"][0]["message"]["content"] == "Sure:" + "".join(PIECES[:2])


def test_clamped_infinite_logprobs():
    from keel.entrypoints.openai.logprobs import clamp

    assert clamp(-math.inf) == -9999.0 and clamp(math.nan) == -9999.0 and clamp(-1.5) == -1.5


def test_vllm_response_extras(scripted):
    """request_id names the response, return_token_ids / return_tokens_as_token_ids, truncate_prompt_tokens,
    add_special_tokens: what vLLM's clients read back."""
    served, fake = scripted
    status, body = post(
        served,
        "/v1/completions",
        {
            "model": MODEL_NAME,
            "prompt": [5, 6, 7, 8],
            "max_tokens": 3,
            "request_id": "abc",
            "return_token_ids": True,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "truncate_prompt_tokens": 2,
        },
    )
    assert status == 200, body
    choice = body["choices"][0]
    assert body["id"] == "cmpl-abc" and fake.prompts_seen[-1] == [7, 8]  # the last 2 prompt tokens
    assert choice["prompt_token_ids"] == [7, 8] and choice["token_ids"] == [10, 11, 12]
    assert choice["logprobs"]["tokens"] == ["token_id:10", "token_id:11", "token_id:12"]
    tok = fake.tokenizer
    for flag in (True, False):
        status, body = post(
            served,
            "/v1/completions",
            {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 1, "add_special_tokens": flag},
        )
        assert status == 200 and fake.prompts_seen[-1] == tok.encode("hi", add_special_tokens=flag)
