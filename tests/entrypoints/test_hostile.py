"""Hostile requests against `keel serve`: each one a 4xx naming the field (or refused at start),
the server still up and still serving others. One test per case; each failed before its fix."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from keel_dev.hostile import surrogate_cases
from support.native import needs_ops
from support.serve import MODEL_NAME, Served, start_server

pytestmark = needs_ops


def call(
    base: str,
    path: str,
    body: Any = None,
    *,
    raw: bytes | None = None,
    headers: dict | None = None,
    method: str | None = None,
    timeout: float = 60,
) -> tuple[int, dict, dict]:
    """(status, JSON body, headers) of one request; `raw` sends bytes as they are."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(base + path, data, {"content-type": "application/json", **(headers or {})})
    if method:
        req.method = method
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"{}"), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        text = exc.read()
        return exc.code, json.loads(text) if text.startswith(b"{") else {"raw": text.decode()}, dict(exc.headers)


def healthy(base: str) -> bool:
    return call(base, "/health", timeout=10)[0] == 200


@pytest.fixture(scope="module")
def trusted(tiny_model: Path) -> Iterator[Served]:
    """A server whose operator allows request chat templates, with short limits for the tests."""
    from keel.entrypoints.openai.server_config import ServerConfig

    limits = ServerConfig(
        max_tokens=512,
        template_timeout_s=2.0,
        send_timeout_s=1.0,
        header_timeout_s=1.0,
        body_timeout_s=1.0,
        grammar_timeout_s=2.0,
    )
    s = start_server(tiny_model, limits=limits, trust_request_chat_template=True)
    yield s
    s.stop()


# ---- malformed input is a 4xx naming the field ---------------------------------------------------------------------


@pytest.mark.parametrize(("path", "raw", "param"), surrogate_cases(MODEL_NAME))
def test_lone_surrogate_is_a_400_naming_the_field(served, path, raw, param):
    status, body, _ = call(served.base_url, path, raw=raw)
    assert status == 400, body
    assert body["error"]["param"] == param and "Unicode" in body["error"]["message"], body


def test_logit_bias_key_that_is_a_digit_but_not_ascii_is_a_400(served):
    body = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 1, "logit_bias": {"\u00b2": 1}}
    status, answer, _ = call(served.base_url, "/v1/completions", body)
    assert status == 400 and answer["error"]["param"] == "logit_bias", answer


def test_405_says_which_methods_the_route_takes(served):
    status, body, headers = call(served.base_url, "/v1/completions", method="GET")
    assert status == 405 and headers.get("allow") == "POST", (body, headers)


def test_openapi_documents_the_status_it_sends_and_the_server_limits(served):
    status, doc, _ = call(served.base_url, "/openapi.json")
    assert status == 200
    for path, ops in doc["paths"].items():
        for op in ops.values():
            assert "422" not in op.get("responses", {}), path  # validation errors are 400s
    post = doc["paths"]["/v1/completions"]["post"]
    assert "400" in post["responses"]
    schema = doc["components"]["schemas"]["CompletionRequest"]["properties"]["max_tokens"]
    bounds = [schema] + schema.get("anyOf", [])
    assert any(b.get("maximum") == 512 for b in bounds), schema  # the server's --max-tokens-limit
    # the request a validation error comes from, sent: a 400 as documented
    assert call(served.base_url, "/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "n": 99})[0] == 400


@pytest.mark.parametrize("key", ["k\u00e9y", "key ", " key", "ke\ty"])
def test_an_api_key_no_client_can_send_is_refused_at_start(key):
    from keel.entrypoints.openai.api_server import check_bind

    with pytest.raises(ValueError, match="--api-key"):
        check_bind("127.0.0.1", key)


def test_keel_serve_refuses_a_bad_api_key_before_loading_anything(tmp_path, capsys):
    from keel.cli import main

    code = main(["serve", "--model", str(tmp_path / "absent"), "--api-key", "key "])
    err = capsys.readouterr().err
    assert code == 1 and "--api-key" in err and "whitespace" in err and "absent" not in err, err


def test_the_key_guards_every_route_but_health_version_metrics(tiny_model):
    s = start_server(tiny_model, api_key="s3cret")
    try:
        base = s.base_url
        for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1]}), ("/v1/models", None)):
            assert call(base, path, body)[0] == 401, path
            for scheme in ("Bearer", "bearer", "BEARER"):
                assert call(base, path, body, headers={"authorization": f"{scheme} s3cret"})[0] == 200, (path, scheme)
        assert call(base, "/tokenize", {"prompt": "hi"}, headers={"authorization": "Bearer wrong"})[0] == 401
        for path in ("/health", "/version", "/metrics"):
            req = urllib.request.urlopen(base + path, timeout=10)
            assert req.status == 200, path
    finally:
        s.stop()


def test_metrics_show_no_path_on_disk(tiny_model):
    from keel.entrypoints.openai.api_server import metrics_label

    assert metrics_label(str(tiny_model)) == tiny_model.name
    assert metrics_label("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


# ---- grammars bounded and compiled off the engine thread -----------------------------------------------------------


def chain_grammar(rules: int) -> str:
    """A Lark grammar of `rules` rules, each calling the next (llguidance validates it recursively)."""
    return "\n".join(["start: r0"] + [f'r{i}: "a" r{i + 1}' for i in range(rules)] + [f'r{rules}: "b"'])


@pytest.mark.parametrize("field", ["structured_outputs", "guided_grammar"])
def test_a_grammar_of_thousands_of_chained_rules_is_a_400_and_the_server_lives(served, field):
    grammar = chain_grammar(3500)  # ~57 KB: SIGSEGV of the whole server before
    body = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2}
    body.update({"structured_outputs": {"grammar": grammar}} if field == "structured_outputs" else {field: grammar})
    status, answer, _ = call(served.base_url, "/v1/completions", body)
    assert status == 400, answer
    assert answer["error"]["param"] in (field, "structured_outputs.grammar") and "limit" in answer["error"]["message"]
    assert healthy(served.base_url)


def test_a_schema_of_ten_thousand_properties_is_a_400_naming_the_limit(served):
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(10_000)}}
    body = {
        "model": MODEL_NAME,
        "prompt": "hi",
        "max_tokens": 2,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    }
    status, answer, _ = call(served.base_url, "/v1/completions", body)
    assert status == 400 and answer["error"]["param"] == "response_format" and "limit" in answer["error"]["message"]


def test_grammar_workers_have_a_stack_deep_grammars_cannot_overflow(tiny_model):
    """Past the server's limits (raised here), 3,500 chained rules compile on a worker: no SIGSEGV."""
    code = f"""
from pathlib import Path
from keel.structured.grammar import GrammarCompiler, GrammarLimits
g = GrammarCompiler(Path({str(tiny_model / "tokenizer.json")!r}), 320, [0],
                    limits=GrammarLimits(max_bytes=1 << 20, max_rules=10**6))
rules = ["start: r0"] + [f'r{{i}}: "a" r{{i + 1}}' for i in range(3500)] + ['r3500: "b"']
m = g.matcher("grammar", "\\n".join(rules))
print("ok", m.is_error())
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd="/")
    assert done.returncode == 0 and "ok False" in done.stdout, (done.returncode, done.stderr[-2000:])


def test_a_request_waits_for_its_grammar_the_batch_does_not(trusted):
    """While one request's grammar is being built (held here), another request is served to the end."""
    llm = trusted.engine.engine
    compiler = llm.grammars()
    gate, entered = threading.Event(), threading.Event()
    original = compiler._build

    def slow_build(*args: Any) -> Any:
        entered.set()
        gate.wait(60)
        return original(*args)

    compiler._build = slow_build
    try:
        result: list = []
        body = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 3, "structured_outputs": {"regex": "[ab]{3}"}}
        t = threading.Thread(target=lambda: result.append(call(trusted.base_url, "/v1/completions", body)))
        t.start()
        assert entered.wait(30)
        status, answer, _ = call(
            trusted.base_url, "/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 4}, timeout=30
        )
        assert status == 200 and answer["choices"][0]["finish_reason"] in ("stop", "length")
        assert t.is_alive()  # the grammar request still waits
        gate.set()
        t.join(60)
        assert result[0][0] == 200, result
    finally:
        gate.set()
        compiler._build = original


# ---- templates are the operator's choice, rendered off the event loop with bounds ----------------------------------

TEMPLATE_BODY = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_a_request_chat_template_needs_the_operators_flag(served, path):
    body = {**TEMPLATE_BODY, "chat_template": "{{ messages[0].content }}"}
    if path == "/tokenize":
        body.pop("max_tokens")
    status, answer, _ = call(served.base_url, path, body)
    assert status == 400 and answer["error"]["param"] == "chat_template", answer


LOOPS = (
    "{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}{% endfor %}{% endfor %}{% endfor %}"
)


@pytest.mark.parametrize(
    ("template", "needle"),
    [(LOOPS, "2 s"), ("{% set s = 'a' * 1000000000 %}{{ s }}", "memory"), ("{{ 'ab' * 600000 }}", "characters")],
    ids=["nested-loops", "gigabyte-string", "long-output"],
)
def test_a_hostile_template_is_a_400_and_health_answers_meanwhile(trusted, template, needle):
    result: list = []
    body = {**TEMPLATE_BODY, "chat_template": template}
    t = threading.Thread(target=lambda: result.append(call(trusted.base_url, "/v1/chat/completions", body)))
    t.start()
    answered = 0
    while t.is_alive():
        assert healthy(trusted.base_url)  # the event loop is free while the template runs
        answered += 1
        time.sleep(0.05)
    status, answer, _ = result[0]
    assert status == 400 and answer["error"]["param"] == "messages" and needle in answer["error"]["message"], answer
    # the next render gets a working worker
    ok = call(trusted.base_url, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
    assert ok[0] == 200 and ok[1]["count"] > 0


# ---- no client holds what others need ------------------------------------------------------------------------------


def test_a_stream_nobody_reads_is_ended_at_the_send_timeout():
    """A response write the client does not take within the send timeout (it stopped reading: uvicorn's send
    waits for the socket to drain) ends the response through FastAPI's middleware and error handlers: the
    stream's cleanup runs (keel's SSEResponse aborts its requests there) and the connection is aborted."""
    import asyncio

    from fastapi import FastAPI
    from starlette.responses import StreamingResponse

    from keel.entrypoints.openai.api_server import Guard
    from keel.entrypoints.openai.errors import install_handlers

    app = FastAPI()
    install_handlers(app)
    closed: list[str] = []

    async def events() -> Any:
        try:
            for i in range(10**6):
                yield f"data: {i}\n\n"
        finally:
            closed.append("stream")

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        return StreamingResponse(events(), media_type="text/event-stream")

    class Cycle:  # uvicorn's request cycle: `send` is its method, `transport` its connection
        def __init__(self) -> None:
            self.sent = 0
            self.transport = self
            self.aborted = False

        def abort(self) -> None:
            self.aborted = True

        async def send(self, message: Any) -> None:
            self.sent += 1
            if self.sent > 3:  # the client stopped reading: the socket never drains
                await asyncio.Event().wait()

    async def receive() -> Any:
        await asyncio.Event().wait()

    cycle = Cycle()
    guard = Guard(app, None, 1 << 20, send_timeout_s=0.2)
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/stream",
        "headers": [],
        "query_string": b"",
        "http_version": "1.1",
        "scheme": "http",
        "server": ("127.0.0.1", 1),
        "client": ("127.0.0.1", 2),
        "root_path": "",
    }
    asyncio.run(asyncio.wait_for(guard(scope, receive, cycle.send), 30))
    assert closed == ["stream"] and cycle.aborted and guard.num_send_timeouts == 1


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_slow_headers_are_cut_at_the_header_timeout(trusted):
    sock = socket.create_connection((trusted.thread.host, trusted.thread.port))
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n")  # never the blank line
        assert _closed_within(sock, 10)
    finally:
        sock.close()


def test_a_body_slower_than_the_body_timeout_is_a_408(trusted):
    sock = socket.create_connection((trusted.thread.host, trusted.thread.port))
    try:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b'content-length: 100\r\n\r\n{"model"'
        )
        sock.settimeout(15)
        head = sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 408"), head
    finally:
        sock.close()


def test_uvicorn_gets_the_connection_limits(trusted):
    from keel.entrypoints.openai.api_server import uvicorn_config

    cfg = uvicorn_config(trusted.thread.app, host="127.0.0.1", port=1, log_level="warning")
    assert cfg.limit_concurrency == 1024 and cfg.timeout_keep_alive == 5 and cfg.h11_max_incomplete_event_size > 0


# ---- the engine's typed errors -------------------------------------------------------------------------------------


def test_param_of_reads_the_engine_errors_field():
    from keel.engine.errors import RequestValidationError
    from keel.entrypoints.openai.serving_engine import param_of

    assert param_of(RequestValidationError("top_p", "SamplingParams: top_p must be in (0, 1]")) == "top_p"
    assert param_of(ValueError("SamplingParams: top_p must be in (0, 1]")) is None  # no message parsing


# ---- an admission slot is freed when the engine is done, not when the client reads ---------------------------------


class _OneStepEngine:
    """A SyncEngine that finishes every request in the step after it was added."""

    def __init__(self) -> None:
        self.pending: list[str] = []

    def add_request(self, request_id: str, prompt: Any, params: Any = None) -> None:
        self.pending.append(request_id)

    def abort_request(self, request_id: str) -> None:
        if request_id in self.pending:
            self.pending.remove(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.pending)

    def step(self) -> list[Any]:
        from keel.engine.output import RequestOutput

        done, self.pending = self.pending, []
        return [RequestOutput(r, None, [1], "x", [2], "x", [2], True, "length", 0, 0.0, 0.0) for r in done]

    def metrics(self) -> Any:
        from keel.engine.output import EngineMetrics

        return EngineMetrics(0, 0, 0, 0, 0, 0, 0, 0, 0)


def test_a_finished_request_holds_no_admission_slot_while_its_reader_lags():
    import asyncio

    from keel.engine.async_engine import AsyncEngine, Overloaded

    async def scenario() -> tuple[int, int, int]:
        engine = AsyncEngine(_OneStepEngine(), max_admitted=4)
        try:
            stream = await engine.open(["a", "b", "c", "d"], [[1]] * 4, [None] * 4)  # type: ignore[list-item]
            deadline = asyncio.get_running_loop().time() + 30
            while stream.outputs.qsize() < 4 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)  # the engine finished them (outputs delivered); nobody reads them
            admitted = engine.num_admitted  # the four finished sub-requests hold no slot, though unread
            other = await engine.open(["e"], [[1]], [None])  # type: ignore[list-item]  # so a slot is free
            still_open = engine.num_open - 1  # (e may be finished already: count the unread stream only)
            other.close()
            stream.close()
            return admitted, still_open, engine.num_open
        except Overloaded:
            return -1, -1, -1
        finally:
            engine.shutdown()

    assert asyncio.run(scenario()) == (0, 4, 0)
