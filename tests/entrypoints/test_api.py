"""The OpenAI endpoints through the real `openai` client: answers match the offline engine, streams match."""

from __future__ import annotations

import json
import urllib.request

import pytest
from support.serve import MODEL_NAME, needs_ops

pytestmark = needs_ops

PROMPT = "The quick brown fox"
MESSAGES = [{"role": "user", "content": "Paged attention stores keys"}]


@pytest.fixture(scope="module")
def offline(tiny_model):
    """`keel.LLM` on the same checkpoint and settings: the reference answers."""
    from keel.engine import LLM

    return LLM(str(tiny_model), dtype="float32", device="cpu", block_size=4, progress=False)


def greedy(max_tokens: int = 12):
    from keel.engine import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0)


def test_completion_matches_offline_generate(served, offline):
    ref = offline.generate(PROMPT, greedy())[0]
    r = served.client().completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=12, temperature=0)
    assert r.object == "text_completion" and r.model == MODEL_NAME and r.id.startswith("cmpl-")
    (choice,) = r.choices
    assert choice.text == ref.text
    assert choice.finish_reason == ("length" if ref.finish_reason == "length" else "stop")
    assert r.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert r.usage.completion_tokens == len(ref.token_ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completion_stream_equals_non_stream(served):
    client = served.client()
    whole = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=12, temperature=0)
    chunks = list(
        client.completions.create(
            model=MODEL_NAME,
            prompt=PROMPT,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_matches_offline_chat(served, offline):
    ref = offline.chat(MESSAGES, greedy())[0]
    r = served.client().chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=12, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    (choice,) = r.choices
    assert choice.message.role == "assistant" and choice.message.content == ref.text
    assert r.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert r.usage.completion_tokens == len(ref.token_ids)


def test_chat_stream_equals_non_stream(served):
    client = served.client()
    whole = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=12, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model=MODEL_NAME,
            messages=MESSAGES,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_raw_sse_ends_with_done(served):
    body = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 4, "temperature": 0, "stream": True}
    req = urllib.request.Request(
        served.base_url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [e for e in resp.read().decode().split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[-1]["choices"][0]["delta"] == {} and chunks[-1]["choices"][0]["finish_reason"]


def test_n_choices_with_seed_are_reproducible(served):
    client = served.client()
    kw = dict(model=MODEL_NAME, prompt=PROMPT, max_tokens=8, temperature=1.0, n=3, seed=7)
    first, again = client.completions.create(**kw), client.completions.create(**kw)
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    assert len({c.text for c in first.choices}) > 1  # per-choice seeds differ
    single = client.completions.create(**{**kw, "n": 1})
    assert first.usage.prompt_tokens == single.usage.prompt_tokens  # the prompt is counted once


def test_stop_string_cuts_the_text(served):
    client = served.client()
    full = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=16, temperature=0).choices[0].text
    assert len(full) >= 6, full
    stop = full[3:5]
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop])
    assert r.choices[0].text == full[: full.find(stop)]
    assert r.choices[0].finish_reason == "stop"


def test_models_and_health(served):
    client = served.client()
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME
    with urllib.request.urlopen(served.base_url + "/health", timeout=10) as resp:
        assert resp.status == 200


def test_metrics_count_tokens_and_first_tokens(served):
    before = served.metrics()
    r = served.client().completions.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
    )
    after = served.wait_idle()
    assert r.usage.completion_tokens == 5
    gen = "vllm:generation_tokens_total"
    assert after[gen] - before[gen] == 5
    assert after["vllm:prompt_tokens_total"] > before["vllm:prompt_tokens_total"]
    ttft = "vllm:time_to_first_token_seconds_count"
    assert after[ttft] - before[ttft] == 1
    assert (
        after['vllm:request_success_total{finished_reason="length"}']
        - before['vllm:request_success_total{finished_reason="length"}']
        == 1
    )
    assert after["keel_kv_cache_blocks_total"] > 0
