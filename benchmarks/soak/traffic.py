"""The requests of benchmarks/soak/serve.py: a weighted mix of good, aborted and bad ones, each with its outcome
(docs/measurements/2026-12-01-soak.md).

Every request ends in one outcome. Allowed: `completed` (a whole, well-formed answer), `client_aborted`
(the soak itself hung up: a mid-stream disconnect or a client timeout), `4xx` (the error status that
request deserved, e.g. 400 for malformed JSON, 413 for an oversized body) and `503` (overloaded, which
any generation request may be told). Anything else is a failure: `500` (any other 5xx), `unexpected`
(a status the request did not deserve), `connection_error` (the server dropped a connection the client
did not give up on), `stream_error` (an error event or no `[DONE]` in a stream), `bad_response` (a 200
without every choice finished) and `hang` (no outcome before the per-request deadline).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2 as httpx
import openai

ALLOWED = ("completed", "client_aborted", "4xx", "503")
FAILURES = ("500", "unexpected", "connection_error", "stream_error", "bad_response", "hang")
WORDS = "the cache holds blocks of tokens while a batch decodes and the server streams each answer back".split()
MAX_N = 16  # the server's largest n
UNIT = " paged attention keeps every block."  # the repeated text of long prompts


@dataclass(slots=True)
class Outcome:
    kind: str
    outcome: str
    status: int | None
    latency_s: float
    ttft_s: float | None = None
    detail: str = ""


@dataclass
class Target:
    """What the traffic needs to know about the server it drives."""

    base_url: str
    model: str
    max_model_len: int
    max_body_bytes: int
    max_admitted: int  # --max-num-seqs + --max-waiting: sequences the server admits at once
    deadline_s: float  # a request without an outcome by then is a hang
    max_new: int = 32  # new tokens per ordinary request at most
    long_tokens: int = 0  # the longest prompt of the `long_prompt` kind (capped by the context)
    kv_tokens: int = 1 << 30  # tokens the whole KV cache holds: a longer request would be refused
    chat_max_new: int = 32  # new tokens of a chat request at most (calibrated to fit the context)
    unit_tokens: float = 0.0  # tokens per UNIT (calibrated)
    base_tokens: int = 0  # tokens of a long prompt's tag (calibrated)
    http: httpx.AsyncClient = field(init=False)
    oai: openai.AsyncOpenAI = field(init=False)

    def open(self, connections: int) -> None:
        # idle connections expire before the server's 5 s keep-alive does, so the client never reuses one
        # at the moment the server closes it (a race of the client's, not a fault of the server's)
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections, keepalive_expiry=2)
        self.http = httpx.AsyncClient(base_url=self.base_url, timeout=self.deadline_s, limits=limits)
        self.oai = openai.AsyncOpenAI(
            base_url=self.base_url + "/v1",
            api_key="unused",
            max_retries=0,
            timeout=self.deadline_s,
            http_client=openai.DefaultAsyncHttpxClient(limits=limits, timeout=self.deadline_s),
        )

    async def close(self) -> None:
        await self.http.aclose()
        await self.oai.close()

    def long_prompt(self, rng: random.Random, tokens: int) -> str:
        """A prompt of about `tokens` tokens whose first block differs from every other's (no prefix hits)."""
        reps = max(1, int((tokens - self.base_tokens) / self.unit_tokens))
        return f"q{rng.randrange(10**6):06d}" + UNIT * reps


def chat_messages(text: str) -> list[dict]:
    """A conversation of one user turn after a system prompt every chat shares (a prefix-cache hit)."""
    return [{"role": "system", "content": "You are the keel soak."}, {"role": "user", "content": text}]


def sentence(rng: random.Random, n: int = 8) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def status_outcome(status: int, expect: int | None) -> str:
    """The outcome of an error status: the 4xx the request deserved (`expect`), or else 503 (overloaded,
    which any well-formed generation request may hear: `expect` None), or a failure."""
    if status == expect:
        return "4xx"
    if status == 503 and expect is None:
        return "503"
    return "500" if status >= 500 and status != 503 else "unexpected"


def check_choices(body: dict, n: int) -> str:
    """`completed` when the body has choices 0..n-1, each with a finish reason."""
    done = {c.get("index") for c in body.get("choices", []) if c.get("finish_reason") in ("stop", "length")}
    return "completed" if done == set(range(n)) else "bad_response"


async def read_sse(resp: httpx.Response, abort_after: int | None) -> tuple[str, float | None, set[int], str]:
    """Read an SSE stream: (outcome, ttft, finished choice indexes, detail); hang up after `abort_after` events."""
    t0, ttft, events, finished = time.perf_counter(), None, 0, set()
    async for line in resp.aiter_lines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            return "completed", ttft, finished, ""
        obj = json.loads(line[6:])
        if "error" in obj:
            return "stream_error", ttft, finished, str(obj["error"].get("message"))[:200]
        ttft = ttft if ttft is not None else time.perf_counter() - t0
        events += 1
        for c in obj.get("choices", []):
            if c.get("finish_reason"):
                finished.add(c["index"])
        if abort_after is not None and events >= abort_after:
            return "client_aborted", ttft, finished, f"hung up after {events} events"
    return "stream_error", ttft, finished, "the stream ended without data: [DONE]"


class Traffic:
    """The request kinds, picked by weight; `one()` runs one request and returns its outcome."""

    def __init__(self, target: Target, rng: random.Random) -> None:
        self.t, self.rng = target, rng
        self.kinds: dict[str, tuple[float, Callable[[], Awaitable[Outcome]]]] = {
            "completion": (3, lambda: self.completion(stream=False)),
            "completion_stream": (3, lambda: self.completion(stream=True)),
            "chat": (2, lambda: self.chat(stream=False)),
            "chat_stream": (2, lambda: self.chat(stream=True)),
            "n_choices": (2, lambda: self.completion(stream=self.rng.random() < 0.5, n=self.rng.randint(2, 4))),
            "abort_stream": (2, self.abort_stream),
            "client_timeout": (2, self.client_timeout),
            "long_prompt": (2, self.long),
            "malformed_json": (1, lambda: self.bad_body("malformed_json")),
            "unknown_field": (1, lambda: self.bad_body("unknown_field")),
            "too_long_prompt": (1, lambda: self.bad_body("too_long_prompt")),
            "wrong_model": (1, lambda: self.bad_body("wrong_model")),
            "n_over_bound": (1, lambda: self.bad_body("n_over_bound")),
            "oversized_body": (1, lambda: self.bad_body("oversized_body")),
            "oversized_chunked": (1, lambda: self.bad_body("oversized_chunked")),
            "burst": (0, self.burst_one),  # sent by the bursts only
        }

    def pick(self) -> str:
        names = list(self.kinds)
        return self.rng.choices(names, weights=[self.kinds[k][0] for k in names])[0]

    async def one(self, kind: str) -> Outcome:
        t0 = time.perf_counter()
        try:
            out = await asyncio.wait_for(self.kinds[kind][1](), self.t.deadline_s + 5)
        except (TimeoutError, httpx.TimeoutException, openai.APITimeoutError) as exc:  # the client's deadline
            out = Outcome(kind, "hang", None, 0.0, detail=f"no outcome within the deadline: {type(exc).__name__}")
        except (httpx.TransportError, openai.APIConnectionError) as exc:
            out = Outcome(kind, "connection_error", None, 0.0, detail=f"{type(exc).__name__}: {exc}"[:200])
        out.kind, out.latency_s = kind, time.perf_counter() - t0
        return out

    def body(self, prompt: str, max_tokens: int, **extra: Any) -> dict:
        return {"model": self.t.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.8, **extra}

    async def post_json(self, kind: str, body: dict, n: int = 1, timeout: float | None = None) -> Outcome:
        resp = await self.t.http.post("/v1/completions", json=body, timeout=timeout or self.t.deadline_s)
        if resp.status_code != 200:
            return Outcome(kind, status_outcome(resp.status_code, None), resp.status_code, 0.0, detail=resp.text[:200])
        return Outcome(kind, check_choices(resp.json(), n), 200, 0.0)

    async def post_stream(self, kind: str, body: dict, n: int = 1, abort_after: int | None = None) -> Outcome:
        async with self.t.http.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                return Outcome(kind, status_outcome(resp.status_code, None), resp.status_code, 0.0, detail=text[:200])
            outcome, ttft, finished, detail = await read_sse(resp, abort_after)
            if outcome == "completed" and finished != set(range(n)):
                outcome, detail = "bad_response", f"finished choices {sorted(finished)} of {n}"
            return Outcome(kind, outcome, 200, 0.0, ttft, detail)

    async def completion(self, stream: bool, n: int = 1) -> Outcome:
        """Text, token-id or several prompts (n choices each), sometimes with a stop string or a usage chunk."""
        r = self.rng.random()
        prompt: Any = sentence(self.rng)
        if r < 0.2:
            prompt = [self.rng.randrange(3, 256) for _ in range(self.rng.randint(1, 12))]  # byte-level ids: any vocab
        elif r < 0.35:
            prompt = [sentence(self.rng, 4) for _ in range(2)]
        several = isinstance(prompt, list) and isinstance(prompt[0], str)
        choices = n * (len(prompt) if several else 1)
        body = self.body(prompt, self.rng.randint(1, self.t.max_new), n=n, seed=self.rng.randrange(1000))
        if self.rng.random() < 0.3:
            body["stop"] = [self.rng.choice(WORDS)]
        if stream and self.rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
        if stream:
            return await self.post_stream("", body, choices)
        return await self.post_json("", body, choices)

    async def chat(self, stream: bool) -> Outcome:
        messages = chat_messages(sentence(self.rng, 6))
        kwargs: dict[str, Any] = dict(
            model=self.t.model, messages=messages, max_tokens=self.rng.randint(1, self.t.chat_max_new)
        )
        try:
            if not stream:
                r = await self.t.oai.chat.completions.create(**kwargs)
                return Outcome("", "completed" if r.choices[0].finish_reason else "bad_response", 200, 0.0)
            t0, ttft, finish = time.perf_counter(), None, None
            s = await self.t.oai.chat.completions.create(**kwargs, stream=True)
            async for chunk in s:
                ttft = ttft if ttft is not None else time.perf_counter() - t0
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
            return Outcome("", "completed" if finish else "bad_response", 200, 0.0, ttft)
        except openai.APIStatusError as exc:
            return Outcome("", status_outcome(exc.status_code, None), exc.status_code, 0.0, detail=str(exc)[:200])
        except openai.APIConnectionError:  # timeouts included: one() tells them apart
            raise
        except openai.APIError as exc:  # an error event inside the stream
            return Outcome("", "stream_error", 200, 0.0, detail=str(exc)[:200])

    async def abort_stream(self) -> Outcome:
        body = self.body(sentence(self.rng), 48, ignore_eos=True, n=self.rng.choice((1, 1, 2)))
        return await self.post_stream("", body, body["n"], abort_after=self.rng.randint(1, 24))

    async def client_timeout(self) -> Outcome:
        body = self.body(sentence(self.rng), 48, ignore_eos=True)
        try:
            return await self.post_json("", body, timeout=self.rng.uniform(0.02, 1.5))
        except httpx.TimeoutException:
            return Outcome("", "client_aborted", None, 0.0, detail="client timeout")

    async def long(self) -> Outcome:
        """A long prompt (up to --long-tokens, the context or the KV cache): few fit the cache together, so they
        preempt each other as they grow."""
        max_tokens = self.rng.randint(8, 32)  # they grow after admission: that is what preempts
        top = min(self.t.long_tokens, self.t.max_model_len, self.t.kv_tokens - 16) - max_tokens - 8
        prompt = self.t.long_prompt(self.rng, self.rng.randint(int(0.6 * top), top))
        body = self.body(prompt, max_tokens, ignore_eos=True)
        if self.rng.random() < 0.5:
            return await self.post_stream("", body)
        return await self.post_json("", body)

    async def bad_body(self, kind: str) -> Outcome:
        """A request the server must refuse with the 4xx it deserves (400, 404 or 413), in OpenAI's error body."""
        good = self.body(sentence(self.rng), 8)
        expect, headers = 400, {"content-type": "application/json"}
        content: bytes | AsyncIterator[bytes]
        if kind == "malformed_json":
            raw = json.dumps(good).encode()
            content = self.rng.choice([raw[: self.rng.randint(1, len(raw) - 1)], b"[1, 2", b"\xff\xfe", b"null"])
        elif kind == "unknown_field":
            content = json.dumps({**good, f"bogus_{self.rng.randrange(100)}": 1}).encode()
        elif kind == "wrong_model":
            content, expect = json.dumps({**good, "model": "not-" + self.t.model}).encode(), 404
        elif kind == "n_over_bound":  # more sequences than the server ever admits at once: no retry helps
            n = MAX_N
            prompts = [sentence(self.rng, 3) for _ in range(self.t.max_admitted // n + 1)]
            content = json.dumps({**good, "prompt": prompts, "n": n}).encode()
        elif kind == "too_long_prompt":
            over = self.t.max_model_len + self.rng.randint(8, max(8, self.t.max_model_len // 8))
            content = json.dumps({**good, "prompt": self.t.long_prompt(self.rng, over)}).encode()
            expect = 413 if len(content) > self.t.max_body_bytes else 400  # the body limit is checked first
        else:
            expect, size = 413, self.t.max_body_bytes + self.rng.randint(1, self.t.max_body_bytes)
            raw = json.dumps({**good, "prompt": "x" * size}).encode()
            content = raw if kind == "oversized_body" else chunks(raw, 64 * 1024)
        try:
            resp = await self.t.http.post("/v1/completions", content=content, headers=headers)
        except (httpx.WriteError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
            if expect == 413:  # the server may answer 413 and close while the body is still being sent
                return Outcome("", "4xx", None, 0.0, detail=f"closed while sending: {type(exc).__name__}")
            raise
        try:
            has_error = "error" in resp.json()
        except ValueError:
            has_error = False
        if not has_error:
            return Outcome("", "unexpected", resp.status_code, 0.0, detail="no error body: " + resp.text[:200])
        return Outcome("", status_outcome(resp.status_code, expect), resp.status_code, 0.0, detail=resp.text[:200])

    async def burst_one(self) -> Outcome:
        """One request of a burst: long enough to still be running when the burst's last one arrives."""
        body = self.body(sentence(self.rng), self.rng.randint(16, 32), ignore_eos=True)
        out = await (self.post_stream("", body) if self.rng.random() < 0.5 else self.post_json("", body))
        return out


async def chunks(raw: bytes, size: int) -> AsyncIterator[bytes]:
    """`raw` as a chunked body (no content-length: the server must count as it reads)."""
    for i in range(0, len(raw), size):
        yield raw[i : i + size]
        await asyncio.sleep(0)


async def calibrate(t: Target) -> None:
    """From the server's own usage counts: the room a chat leaves in the context, and tokens per UNIT and per
    tag, so long prompts land near the length they aim at."""

    async def tokens(text: str) -> int:
        r = await t.http.post("/v1/completions", json={"model": t.model, "prompt": text, "max_tokens": 1})
        r.raise_for_status()
        return int(r.json()["usage"]["prompt_tokens"])

    longest = " ".join(sorted(WORDS, key=len)[-6:])  # a chat's 6 random words: about as many tokens or fewer
    body = {"model": t.model, "messages": chat_messages(longest), "max_tokens": 1}
    chat = await t.http.post("/v1/chat/completions", json=body)
    chat.raise_for_status()
    room = t.max_model_len - int(chat.json()["usage"]["prompt_tokens"]) - 16  # 16 tokens to spare
    if room < 1:
        raise RuntimeError(f"soak: a chat prompt leaves no room in the model's {t.max_model_len}-token context")
    t.chat_max_new = min(t.max_new, room)
    tag = await tokens("q123456")
    reps = max(4, min(64, t.max_model_len // 64))
    many = await tokens("q123456" + UNIT * reps)
    t.base_tokens, t.unit_tokens = tag, (many - tag) / reps
