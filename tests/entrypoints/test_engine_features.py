"""The new request fields end to end on the real engine, through the openai client: loglikelihood scoring
of a multiple-choice question via /v1/completions echo + logprobs (against `LLM`'s offline prompt logprobs
and transformers' float32 logits), chat logprobs against `LLM`, structured outputs that parse and validate,
a tool call round trip with tool_choice required / named, and best_of."""

from __future__ import annotations

import json
import re

import pytest
from support.serve import MODEL_NAME, needs_ops

pytestmark = needs_ops

jsonschema = pytest.importorskip("jsonschema")

CONTEXT = "The quick brown fox"
CHOICES = [" jumps", " sleeps", " runs over"]


@pytest.fixture(scope="module")
def offline(tiny_model):
    from keel.engine import LLM

    return LLM(str(tiny_model), dtype="float32", device="cpu", block_size=4, progress=False)


@pytest.fixture(scope="module")
def hf_logprobs(tiny_model):
    """transformers' float32 log-softmax of the tiny checkpoint, per position: ids -> [len(ids), vocab]."""
    import torch
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32).eval()

    def run(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)

    return run


def continuation(tok, choice: str) -> tuple[list[int], int]:
    """lm-eval's request: the token ids of context + continuation, and how many are context."""
    ctx = tok.encode(CONTEXT)
    whole = tok.encode(CONTEXT + choice)
    assert whole[: len(ctx)] == ctx
    return whole, len(ctx)


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_multiple_choice_loglikelihood_matches_offline_and_transformers(served, offline, hf_logprobs, max_tokens):
    from keel.engine import SamplingParams

    tok = served.engine.engine.tokenizer
    client = served.client()
    scores = {}
    for choice in CHOICES:
        ids, ctxlen = continuation(tok, choice)
        r = client.completions.create(model=MODEL_NAME, prompt=ids, echo=True, logprobs=1, max_tokens=max_tokens)
        lp = r.choices[0].logprobs
        assert lp.token_logprobs[0] is None and len(lp.tokens) == len(ids) + max_tokens
        served_lp = lp.token_logprobs[ctxlen : len(ids)]  # lm-eval: [ctxlen:-1] with max_tokens 1
        ref = offline.generate([ids], SamplingParams(max_tokens=0, prompt_logprobs=1))[0].prompt_logprobs
        offline_lp = [ref[i][ids[i]].logprob for i in range(ctxlen, len(ids))]
        hf = hf_logprobs(ids)
        hf_lp = [hf[i - 1, ids[i]].item() for i in range(ctxlen, len(ids))]
        assert served_lp == pytest.approx(offline_lp, abs=1e-5)
        assert served_lp == pytest.approx(hf_lp, abs=1e-3)
        # is_greedy as lm-eval reads it: the top-1 entry of each continuation position
        for i in range(ctxlen, len(ids)):
            best = max(lp.top_logprobs[i].items(), key=lambda kv: kv[1])[0]
            assert (best == lp.tokens[i]) == (hf[i - 1].argmax().item() == ids[i])
        scores[choice] = sum(served_lp)
    hf_scores = {}
    for choice in CHOICES:
        ids, ctxlen = continuation(tok, choice)
        hf = hf_logprobs(ids)
        hf_scores[choice] = sum(hf[i - 1, ids[i]].item() for i in range(ctxlen, len(ids)))
    assert max(scores, key=scores.get) == max(hf_scores, key=hf_scores.get)


def test_echo_without_logprobs_returns_the_prompt(served):
    r = served.client().completions.create(model=MODEL_NAME, prompt=CONTEXT, echo=True, max_tokens=0)
    assert r.choices[0].text == CONTEXT and r.usage.completion_tokens == 0


def test_chat_logprobs_match_offline(served, offline):
    from keel.engine import SamplingParams

    messages = [{"role": "user", "content": "Paged attention stores keys"}]
    r = served.client().chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    ref = offline.chat(messages, SamplingParams(max_tokens=6, temperature=0.0, logprobs=3))[0]
    content = r.choices[0].logprobs.content
    assert len(content) == len(ref.token_ids)
    for entry, tid, step in zip(content, ref.token_ids, ref.logprobs, strict=True):
        assert entry.logprob == pytest.approx(step[tid].logprob, abs=1e-5)
        tops = sorted((e for e in step.values() if e.rank <= 3), key=lambda e: e.rank)
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx([e.logprob for e in tops], abs=1e-5)
        assert entry.top_logprobs[0].logprob >= entry.logprob - 1e-6  # greedy: the sampled token is the top one


SCHEMA = {
    "type": "object",
    # bounded: a random model must still finish the object within max_tokens (letters only: no escapes)
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]{1,8}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_output_validates(served, stream):
    client = served.client()
    kw = dict(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "A person as JSON"}],
        max_tokens=90,
        temperature=0.8,
        seed=3,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}},
    )
    if stream:
        text = "".join(
            c.choices[0].delta.content or "" for c in client.chat.completions.create(**kw, stream=True) if c.choices
        )
    else:
        r = client.chat.completions.create(**kw)
        assert r.choices[0].finish_reason == "stop"
        text = r.choices[0].message.content
    jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize(
    ("extra", "check"),
    [
        ({"response_format": {"type": "json_object"}}, lambda t: isinstance(json.loads(t), dict)),
        ({"guided_choice": ["red", "green", "blue"]}, lambda t: t in ("red", "green", "blue")),
        ({"guided_regex": "[a-c]{3}-[0-9]{2}"}, lambda t: re.fullmatch("[a-c]{3}-[0-9]{2}", t) is not None),
        ({"structured_outputs": {"choice": ["yes", "no"]}}, lambda t: t in ("yes", "no")),
    ],
)
def test_structured_outputs_on_completions(served, extra, check):
    r = served.client().completions.create(
        model=MODEL_NAME, prompt="Answer:", max_tokens=40, temperature=1.0, seed=1, extra_body=extra
    )
    assert check(r.choices[0].text), r.choices[0].text


def test_bad_schema_is_a_400(served):
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        served.client().completions.create(
            model=MODEL_NAME, prompt="x", max_tokens=4, extra_body={"guided_regex": "([a-"}
        )
    assert "guided_regex" in info.value.body["message"] or "regex" in info.value.body["message"]


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "pattern": "^[a-z]{1,8}$"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}},
}


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_round_trip_required(served, stream):
    """tool_choice required: any model returns a valid call; its result goes back and the model answers."""
    client = served.client()
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    kw = dict(model=MODEL_NAME, tools=[WEATHER, CLOCK], tool_choice="required", max_tokens=90, temperature=0)
    kw["parallel_tool_calls"] = False  # one call: a random model would otherwise list calls until max_tokens
    if stream:
        calls, finish = {}, None
        for chunk in client.chat.completions.create(messages=messages, stream=True, **kw):
            for c in chunk.choices:
                for tc in c.delta.tool_calls or []:
                    slot = calls.setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
                    slot["name"] += tc.function.name or ""
                    slot["arguments"] += tc.function.arguments or ""
                finish = c.finish_reason or finish
        assert finish == "tool_calls" and calls
        call = calls[0]
        name, arguments, call_id = call["name"], call["arguments"], call["id"]
    else:
        r = client.chat.completions.create(messages=messages, **kw)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
        tc = choice.message.tool_calls[0]
        name, arguments, call_id = tc.function.name, tc.function.arguments, tc.id
    spec = {"get_weather": WEATHER, "get_time": CLOCK}[name]
    jsonschema.validate(json.loads(arguments), spec["function"]["parameters"])
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "18 C"},
    ]
    final = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=5, tools=[WEATHER], tool_choice="none"
    )
    assert final.choices[0].message.tool_calls in (None, []) and final.choices[0].finish_reason in ("stop", "length")


def test_tool_choice_named_returns_that_function(served):
    r = served.client().chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Weather?"}],
        tools=[WEATHER, CLOCK],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=90,
        temperature=0,
    )
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and r.choices[0].message.content is None
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_best_of_returns_the_highest_cumulative_logprob(served):
    client = served.client()
    kw = dict(model=MODEL_NAME, prompt=CONTEXT, max_tokens=6, temperature=1.0, seed=11)
    every = client.completions.create(**kw, n=3, logprobs=0)
    sums = [sum(c.logprobs.token_logprobs) for c in every.choices]
    best = client.completions.create(**kw, n=1, extra_body={"best_of": 3})
    assert best.choices[0].text == every.choices[max(range(3), key=sums.__getitem__)].text
    assert best.usage.completion_tokens == every.usage.completion_tokens  # all 3 candidates were generated


def test_streamed_echo_scoring_equals_whole(served):
    client = served.client()
    kw = dict(model=MODEL_NAME, prompt=CONTEXT, echo=True, logprobs=2, max_tokens=0)
    whole = client.completions.create(**kw).choices[0]
    chunks = list(client.completions.create(**kw, stream=True))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.token_logprobs]
    assert text == whole.text == CONTEXT and tokens == whole.logprobs.token_logprobs and tokens[0] is None


def test_chat_prompt_logprobs_on_the_response(served):
    import urllib.request

    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "prompt_logprobs": 0}
    req = urllib.request.Request(
        served.base_url + "/v1/chat/completions", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    out = json.loads(urllib.request.urlopen(req, timeout=30).read())
    plp = out["prompt_logprobs"]
    assert plp[0] is None and len(plp) == out["usage"]["prompt_tokens"]
    assert all(len(step) == 1 and next(iter(step.values()))["logprob"] <= 0 for step in plp[1:])  # k=0: the token only
