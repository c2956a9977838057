"""Continuous batching behind the server: concurrent clients, disconnects and aborts, and nothing leaks."""

from __future__ import annotations

import asyncio
import http.client
import json
import random
import time

import openai
import pytest
from support.serve import MODEL_NAME, needs_ops

pytestmark = needs_ops

SENTENCES = [
    "The quick brown fox",
    "Paged attention stores",
    "keel builds one wheel",
    "Hello world! Numbers",
    "def f(x):",
    "The lazy dog",
    "fixed-size blocks",
    "survives torch upgrades",
]
PROMPTS = [f"{SENTENCES[i % 8]} {i}" for i in range(16)]


async def stream_text(client: openai.AsyncOpenAI, prompt: str, max_tokens: int) -> str:
    stream = await client.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True
    )
    return "".join([c.choices[0].text async for c in stream if c.choices])


def test_16_concurrent_streams_match_their_alone_text(served, steps):
    client = served.client()
    alone = [
        client.completions.create(model=MODEL_NAME, prompt=p, max_tokens=16, temperature=0).choices[0].text
        for p in PROMPTS
    ]
    steps.delay_s = 0.005  # keep early requests running while the others arrive

    async def together() -> list[str]:
        async with served.async_client() as aclient:
            return await asyncio.gather(*(stream_text(aclient, p, 16) for p in PROMPTS))

    assert asyncio.run(together()) == alone
    assert steps.peak_running >= 8, f"the requests were not batched together (peak {steps.peak_running})"
    served.wait_idle()


def open_raw_stream(base_url: str, body: dict) -> http.client.HTTPConnection:
    """POST a streaming request and read until its first content event; return the open connection."""
    host, port = base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    seen = b""
    while b'"text"' not in seen:
        seen += resp.read1(4096)
    return conn


def test_disconnect_mid_stream_aborts_and_frees_blocks(served, steps):
    steps.delay_s = 0.02  # a full answer would take >= 100 steps = 2 s
    before = served.metrics()
    body = {
        "model": MODEL_NAME,
        "prompt": "Paged attention",
        "max_tokens": 100,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    conns = [open_raw_stream(served.base_url, body) for _ in range(4)]
    assert served.metrics()["keel_kv_cache_blocks_used"] > 0
    t0 = time.monotonic()
    for c in conns:
        c.close()
    after = served.wait_idle(timeout=20)
    assert time.monotonic() - t0 < 1.5  # freed at once, not after the answers ran to their end
    assert after["keel_request_aborted_total"] - before["keel_request_aborted_total"] == 4
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 4 * 100
    assert after["keel_kv_cache_blocks_used"] == 0


def test_client_timeout_on_non_stream_aborts(served, steps):
    steps.delay_s = 0.02
    before = served.metrics()
    with pytest.raises(openai.APITimeoutError):
        served.client(timeout=0.3).completions.create(
            model=MODEL_NAME, prompt="hi", max_tokens=100, extra_body={"ignore_eos": True}
        )
    after = served.wait_idle(timeout=20)
    assert after["keel_request_aborted_total"] - before["keel_request_aborted_total"] == 1
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 100


def test_200_requests_with_random_aborts_leak_nothing(served):
    rng = random.Random(0)
    before = served.metrics()
    base_tasks = served.server_tasks()
    plans = [
        (rng.choice(["complete", "chat", "break", "timeout"]), rng.randint(1, 24), rng.randint(0, 6))
        for _ in range(200)
    ]

    async def one(client: openai.AsyncOpenAI, gate: asyncio.Semaphore, kind: str, max_tokens: int, k: int) -> str:
        async with gate:
            prompt = PROMPTS[k]
            if kind == "timeout":
                try:
                    await client.with_options(timeout=0.001 * (k + 1)).completions.create(
                        model=MODEL_NAME, prompt=prompt, max_tokens=max_tokens, temperature=0.8, seed=k
                    )
                except openai.APITimeoutError:
                    return "aborted"
                return "done"
            if kind == "chat":
                r = await client.chat.completions.create(
                    model=MODEL_NAME, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens
                )
                return "done" if r.choices[0].finish_reason else "?"
            stream = await client.completions.create(
                model=MODEL_NAME,
                prompt=prompt,
                max_tokens=max_tokens,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            n = 0
            async for _chunk in stream:
                n += 1
                if kind == "break" and n > k:
                    await stream.close()  # drops the connection mid-stream
                    return "aborted"
            return "done"

    async def run_all() -> list[str]:
        gate = asyncio.Semaphore(16)
        async with served.async_client() as client:
            return await asyncio.gather(*(one(client, gate, *p) for p in plans))

    outcomes = asyncio.run(run_all())
    assert outcomes.count("aborted") >= 40 and outcomes.count("done") >= 40
    after = served.wait_idle(timeout=30)
    assert after["keel_kv_cache_blocks_used"] == 0
    assert after["keel_request_aborted_total"] > before["keel_request_aborted_total"]
    deadline = time.monotonic() + 10
    while served.server_tasks() > base_tasks and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served.server_tasks() <= base_tasks  # no task left behind (one alive at the start may have ended)
    assert served.engine.num_open == 0 and not served.engine._open
    # every request the engine was given has left it: no route is kept for a finished or aborted one
    assert served.engine._routes == {}
