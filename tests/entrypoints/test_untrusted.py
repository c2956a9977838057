"""Untrusted input in bounded places, against `keel serve` over the real engine: grammars compiled in killable
worker processes, prompts tokenized off the event loop after a length bound, bad words tokenized once per
request off the engine thread, requests whose own fields leave nothing to sample refused as 400s, and tool
arguments nested past the limit refused before anything parses them."""

from __future__ import annotations

import asyncio
import json
import string
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.native import needs_ops
from support.serve import MODEL_NAME, Served, start_server

pytestmark = needs_ops


def call(base: str, path: str, body: Any, timeout: float = 120) -> tuple[int, dict]:
    """(status, JSON body) of one POST."""
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[Served]:
    from keel.entrypoints.openai.server_config import ServerConfig

    s = start_server(tiny_model, limits=ServerConfig(max_tokens=512, grammar_timeout_s=2.0))
    yield s
    s.stop()


def schema_body(schema: dict[str, Any], **extra: Any) -> dict[str, Any]:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    return {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2, "response_format": fmt, **extra}


def patterns_schema(n: int) -> dict[str, Any]:
    """A string that must match n `.*x.*` patterns at once (their intersection grows exponentially)."""
    return {"type": "string", "allOf": [{"pattern": f".*{c}.*"} for c in (string.ascii_letters[:n])]}


def referenced_patterns_schema(n: int) -> dict[str, Any]:
    """The same intersection behind `$ref`s, which the static count leaves to the worker's limits."""
    letters = string.ascii_lowercase[:n]
    return {
        "$defs": {c: {"pattern": f".*{c}.*"} for c in letters},
        "type": "string",
        "allOf": [{"$ref": f"#/$defs/{c}"} for c in letters],
    }


# ---- who asks -------------------------------------------------------------------------------------------------


def test_each_request_reaches_the_engine_with_its_client(server):
    """The engine's per-client shares key on the API key the server checked (a digest of it), else the peer's
    address; a bearer token the server does not check (clients send placeholders) names nobody."""
    llm, serving = server.engine.engine, server.thread.app.serving
    seen: list[str | None] = []
    original = llm.add_request

    def spy(*args: Any, client: str | None = None, **kwargs: Any) -> Any:
        seen.append(client)
        return original(*args, client=client, **kwargs)

    def send(headers: dict[str, str]) -> None:
        body = json.dumps({"model": MODEL_NAME, "prompt": "hi", "max_tokens": 1, "n": 2}).encode()
        req = urllib.request.Request(
            server.base_url + "/v1/completions", body, {"content-type": "application/json", **headers}
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert resp.status == 200

    llm.add_request = spy
    try:
        send({})
        send({"authorization": "Bearer EMPTY"})
        serving.keyed = True  # as with --api-key (this server checks none, so any token passes the guard)
        send({"authorization": "Bearer secret-one"})
    finally:
        llm.add_request, serving.keyed = original, False
    assert len(seen) == 6 and seen[0] == seen[1] and seen[4] == seen[5], seen
    assert all(c.startswith("127.0.0.1:") for c in seen[:4]) and seen[0] != seen[2]  # one connection each
    assert seen[4].startswith("key:") and "secret" not in seen[4]


# ---- grammars ------------------------------------------------------------------------------------------------


def test_a_thirty_pattern_allof_schema_is_a_400_naming_the_limit(server):
    t0 = time.monotonic()
    status, answer = call(server.base_url, "/v1/completions", schema_body(patterns_schema(30)))
    assert status == 400 and answer["error"]["param"] == "response_format", answer
    assert (
        "allOf intersects 30 string patterns" in answer["error"]["message"]
        and "limit is 12" in answer["error"]["message"]
    )
    assert time.monotonic() - t0 < 5  # refused before anything compiles it


def test_a_compile_past_its_limits_is_killed_and_the_server_keeps_its_memory(server):
    """18 referenced patterns need ~0.6 GB and ~9 s to compile: the worker is ended at its limit, the server
    process does not grow, and the next grammar compiles in a fresh worker."""
    compiler = server.engine.engine.grammars()
    call(server.base_url, "/v1/completions", schema_body({"type": "integer"}))  # the workers are up
    killed, rss = compiler.workers.num_killed, rss_bytes()
    status, answer = call(server.base_url, "/v1/completions", schema_body(referenced_patterns_schema(18)))
    assert status == 400 and answer["error"]["param"] == "response_format", answer
    message = answer["error"]["message"]
    assert "within this server's limit of 2 s" in message or "512 MiB of memory" in message, message
    assert compiler.workers.num_killed == killed + 1
    assert rss_bytes() - rss < 200 << 20
    body = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 3, "structured_outputs": {"choice": ["yes", "no"]}}
    status, answer = call(server.base_url, "/v1/completions", body)
    assert status == 200 and answer["choices"][0]["text"] in ("yes", "no"), answer


def test_a_client_that_goes_away_stops_its_compile(server):
    """With a 30 s compile limit, a client that closes its connection while its grammar compiles has its
    compile worker killed at once, not at the deadline."""
    import dataclasses
    import socket

    serving = server.thread.app.serving
    before = serving.grammar_limits
    serving.grammar_limits = dataclasses.replace(before, compile_timeout_s=30.0, memory_mib=2048)
    try:
        call(server.base_url, "/v1/completions", schema_body({"type": "integer"}))  # the new workers are up
        workers = server.engine.engine.grammars().workers
        killed = workers.num_killed
        body = json.dumps(schema_body(referenced_patterns_schema(18))).encode()
        host, port = server.base_url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            head = "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            s.sendall(head.encode() + b"content-length: %d\r\n\r\n" % len(body) + body)
            deadline = time.monotonic() + 10
            while not any(proc for _, proc in workers._running.values()) and time.monotonic() < deadline:
                time.sleep(0.02)  # until the compile runs in a worker process
            assert workers._running, "the compile never started"
        t0 = time.monotonic()
        while workers.num_killed == killed and time.monotonic() - t0 < 10:
            time.sleep(0.02)
        assert workers.num_killed == killed + 1 and workers.pending == 0
    finally:
        serving.grammar_limits = before


@pytest.mark.slow  # eight compiles killed at their 2 s deadline, their workers restarted
def test_a_small_grammar_right_after_eight_slow_ones_compiles(server):
    results: list[tuple[int, dict]] = []
    slow = [
        threading.Thread(
            target=lambda: results.append(
                call(server.base_url, "/v1/completions", schema_body(referenced_patterns_schema(18)))
            )
        )
        for _ in range(8)
    ]
    for t in slow:
        t.start()
    for t in slow:
        t.join(60)
    assert len(results) == 8 and all(status in (400, 503) for status, _ in results), results
    body = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 3, "structured_outputs": {"choice": ["yes", "no"]}}
    status, answer = call(server.base_url, "/v1/completions", body)
    assert status == 200, answer
    assert server.engine.engine.grammars().workers.pending == 0  # nothing abandoned waits to run


# ---- tokenizing ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/completions", "/tokenize", "/v1/chat/completions"])
def test_a_prompt_longer_than_the_context_could_hold_is_a_400_before_any_tokenizer_call(server, path):
    tokens = server.thread.app.serving.tokens
    calls: list[int] = []
    original = tokens._encode_batch
    tokens._encode_batch = lambda texts, special: (calls.append(len(texts)), original(texts, special))[1]
    try:
        text = "7" * (tokens.max_chars + 1)
        body: dict[str, Any] = {"model": MODEL_NAME} if path == "/tokenize" else {"model": MODEL_NAME, "max_tokens": 1}
        if path == "/v1/chat/completions":
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        status, answer = call(server.base_url, path, body)
    finally:
        tokens._encode_batch = original
    assert status == 400 and "characters" in answer["error"]["message"], answer
    assert answer["error"]["param"] == ("messages" if path == "/v1/chat/completions" else "prompt")
    assert calls == []


def test_tokenizing_a_long_text_leaves_the_event_loop_running(tiny_model):
    """The pool's threads call the tokenizer where it releases the GIL: a ticker on the event loop keeps
    ticking while a multi-megabyte text is tokenized (a single `encode` holds the GIL throughout)."""
    from keel.entrypoints.openai.tokenizing import TokenizerPool
    from keel.hf.tokenizer import Tokenizer

    pool = TokenizerPool(Tokenizer(tiny_model), 128)
    text = "7" * 300_000  # about half a second here

    async def main() -> tuple[int, float]:
        ticks, done = 0, asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                await asyncio.sleep(0.005)
                ticks += 1

        task = asyncio.ensure_future(ticker())
        await asyncio.sleep(0.02)
        ticks, t0 = 0, time.perf_counter()
        await pool.encode(text, add_special_tokens=False, bounded=False)
        took = time.perf_counter() - t0
        done.set()
        await task
        return ticks, took

    try:
        ticks, took = asyncio.run(main())
    finally:
        pool.close()
    assert took > 0.1, "the text tokenized too fast to tell"
    assert ticks >= 10, f"the event loop ticked {ticks} times in {took:.2f} s of tokenizing"  # GIL held: 3 at most


# ---- bad words and stop strings ---------------------------------------------------------------------------------


def test_bad_words_are_tokenized_once_per_request_and_never_on_the_engine_thread(server):
    tok = server.engine.engine.tokenizer
    seen: list[tuple[str, str]] = []
    originals = {name: getattr(tok, name) for name in ("encode", "encode_batch")}

    def spy(name: str) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            seen.append((name, threading.current_thread().name))
            return originals[name](*args, **kwargs)

        return wrapped

    for name in originals:
        setattr(tok, name, spy(name))
    try:
        body = {"model": MODEL_NAME, "prompt": [1, 2, 3], "max_tokens": 3, "n": 4, "bad_words": ["foo", "bar baz"]}
        status, answer = call(server.base_url, "/v1/completions", body)
    finally:
        for name, fn in originals.items():
            setattr(tok, name, fn)
    assert status == 200 and len(answer["choices"]) == 4, answer
    assert len(seen) == 1 and seen[0][0] == "encode_batch" and seen[0][1].startswith("keel-tokenize"), seen


@pytest.mark.parametrize(
    ("extra", "param", "needle"),
    [
        ({"bad_words": [f"w{i}" for i in range(129)]}, "bad_words", "at most 128 bad_words"),
        ({"bad_words": ["7" * 129]}, "bad_words", "at most 128 characters"),
        ({"stop": ["7" * 257]}, "stop", "at most 256 characters"),
    ],
)
def test_bad_words_and_stop_strings_past_their_bounds_are_a_400(server, extra, param, needle):
    body = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2, **extra}
    status, answer = call(server.base_url, "/v1/completions", body)
    assert status == 400 and answer["error"]["param"] == param and needle in answer["error"]["message"], answer


# ---- nothing to sample ----------------------------------------------------------------------------------------


def one_token_word(tok: Any) -> tuple[str, int]:
    """A word of letters that is one token alone and two of itself twice."""
    for t in range(tok.vocab_size):
        w = tok.decode([t], skip_special_tokens=True)
        if w.isalpha() and tok.encode(w, add_special_tokens=False) == [t]:
            if tok.encode(w + w, add_special_tokens=False) == [t, t]:
                return w, t
    raise AssertionError("no such word in the test tokenizer")


def test_allowed_tokens_that_are_all_bad_words_are_a_400_at_admission(server):
    word, t = one_token_word(server.engine.engine.tokenizer)
    body = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2, "allowed_token_ids": [t], "bad_words": [word]}
    status, answer = call(server.base_url, "/v1/completions", body)
    assert status == 400 and answer["error"]["param"] == "allowed_token_ids", answer
    assert "every allowed token is a bad word" in answer["error"]["message"]  # refused before the engine


def test_min_tokens_with_only_stop_tokens_allowed_is_a_400_at_admission(server):
    eos = sorted(server.engine.engine.eos_token_ids)[0]
    body = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 4, "min_tokens": 2, "allowed_token_ids": [eos]}
    status, answer = call(server.base_url, "/v1/completions", body)
    assert status == 400 and answer["error"]["param"] == "min_tokens", answer
    assert "allowed_token_ids" in answer["error"]["message"] and "before min_tokens" in answer["error"]["message"]


def test_a_grammar_that_allows_none_of_the_allowed_tokens_is_a_400_at_admission(server):
    tok = server.engine.engine.tokenizer
    digit = tok.encode("7", add_special_tokens=False)
    body = {
        "model": MODEL_NAME,
        "prompt": "hi",
        "max_tokens": 3,
        "allowed_token_ids": digit,
        "structured_outputs": {"choice": ["yes", "no"]},
    }
    status, answer = call(server.base_url, "/v1/completions", body)
    assert status == 400 and answer["error"]["param"] == "allowed_token_ids", answer
    assert "the grammar allows none of the allowed tokens" in answer["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_masks_that_empty_a_later_step_are_a_client_error_not_an_engine_error(server, stream):
    """allowed [t] with the bad word "tt": t is sampled first, then t is banned and nothing is left."""
    word, t = one_token_word(server.engine.engine.tokenizer)
    body = {
        "model": MODEL_NAME,
        "prompt": "hi",
        "max_tokens": 4,
        "allowed_token_ids": [t],
        "bad_words": [word + word],
        "stream": stream,
    }
    if not stream:
        status, answer = call(server.base_url, "/v1/completions", body)
        assert status == 400 and answer["error"]["param"] == "allowed_token_ids", answer
        error = answer["error"]
    else:
        req = urllib.request.Request(
            server.base_url + "/v1/completions", json.dumps(body).encode(), {"content-type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            events = [line[6:] for line in resp.read().decode().splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_value", error
    assert "nothing can be sampled at output token 2" in error["message"] and "bad_words" in error["message"]


def test_a_grammar_stopped_by_its_parser_limits_mid_generation_is_a_400(server):
    """With at most 20 Earley items per token mask, a schema of arrays of objects passes its compile (the first
    mask) and stops a few tokens in; the request is refused naming the field, not cut short as a stop."""
    import dataclasses

    from keel.structured.grammar import ParserLimits

    serving = server.thread.app.serving
    before = serving.grammar_limits
    serving.grammar_limits = dataclasses.replace(before, parser=ParserLimits(step_max_items=20))
    schema = {
        "type": "object",
        "properties": {"a": {"type": "array", "items": {"type": "object", "properties": {"b": {"type": "string"}}}}},
        "required": ["a"],
    }
    try:
        status, answer = call(server.base_url, "/v1/completions", schema_body(schema, max_tokens=60))
    finally:
        serving.grammar_limits = before
    assert status == 400 and answer["error"]["param"] == "response_format", answer
    assert (
        "matcher stopped at output token" in answer["error"]["message"]
        and "Too many items" in answer["error"]["message"]
    )


# ---- deep JSON in tool calls ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_tool_arguments_nested_100000_deep_are_a_400_naming_the_field(server, path):
    deep = "[" * 100_000 + "]" * 100_000
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": deep}}]},
        {"role": "tool", "tool_call_id": "c", "content": "ok"},
    ]
    body = {"model": MODEL_NAME, "messages": messages}
    status, answer = call(server.base_url, path, body if path == "/tokenize" else {**body, "max_tokens": 1})
    assert status == 400, answer
    assert answer["error"]["param"] == "messages.1.tool_calls.0.function.arguments", answer
    assert "100000 levels" in answer["error"]["message"]
