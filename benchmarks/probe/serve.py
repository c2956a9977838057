"""Probe `keel serve` with hostile requests and print a table per category.

Starts `keel serve` itself on a free loopback port (nothing leaves this machine), with an API key, the
operator's flag for request chat templates (so the template bounds are exercised, not just the refusal),
3 s template and grammar time limits and small admission limits (--max-num-seqs 4 --max-waiting 12: one n=16
client fills them). For each category it runs the cases, while a background client sends a normal 4-token
completion every 0.5 s, and reports: cases, crashes (the server process gone), 5xx answers, cases whose answer
was not the expected one, the slowest normal request during the category, and the server's RSS before and after.

    python benchmarks/probe/serve.py --model PATH [--sample] [--json OUT]

`--sample` runs a few cases per category (what tests/entrypoints/test_probe.py runs); the full run is
bounded too (every request has a timeout, 200 slow connections at most). Exit status 0 when there
were no crashes, no 5xx and no unexpected answers.
Records: docs/measurements/2026-12-02-server-probe.md (the untrusted category: probe/untrusted.py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keel_dev.hostile import surrogate_cases

HOST = "127.0.0.1"
KEY = "probe-key"
MODEL = "probe"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    model: str
    extra: list[str]
    baseline: bool = False  # a keel serve older than its limit flags: none of them
    keyed: bool = True  # --api-key: every caller is then one client to the engine's per-client shares
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    log: Any = None

    @property
    def base(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self, timeout: float = 300) -> None:
        cmd = [sys.executable, "-m", "keel.cli", "serve", "--model", self.model, "--port", str(self.port)]
        cmd += ["--host", HOST, "--served-model-name", MODEL, "--log-level", "warning"]
        cmd += ["--api-key", KEY] if self.keyed else []
        cmd += ["--max-num-seqs", "4", "--max-waiting", "12"]
        if not self.baseline:
            cmd += ["--trust-request-chat-template", "--send-timeout", "3", "--header-timeout", "3"]
            cmd += ["--body-timeout", "3", "--chat-template-timeout", "3", "--grammar-timeout", "3"]
        cmd += self.extra
        self.log = tempfile.TemporaryFile()
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd="/")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"keel serve exited {self.proc.returncode}:\n{self.tail()}")
            try:
                if request(self, "GET", "/health", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("keel serve did not answer /health in time")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def rss_mib(self) -> float:
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        return float("nan")

    def tail(self) -> str:
        if self.log is None:
            return ""
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-3000:]

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(30)


def request(
    srv: Server,
    method: str,
    path: str,
    body: Any = None,
    *,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
    key: str | None = KEY,
    timeout: float = 60,
) -> tuple[int, Any]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    h = {"content-type": "application/json", **(headers or {})}
    if key is not None:
        h.setdefault("authorization", f"Bearer {key}")
    req = urllib.request.Request(srv.base + path, data, h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read()
            return resp.status, _json(text)
    except urllib.error.HTTPError as exc:
        return exc.code, _json(exc.read())


def _json(text: bytes) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text.decode(errors="replace")


NORMAL = {"model": MODEL, "prompt": "hello", "max_tokens": 4}


class Watch:
    """A normal request every 0.5 s while a category runs: the slowest latency, and failures."""

    def __init__(self, srv: Server) -> None:
        self.srv, self.stop_event = srv, threading.Event()
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.overloaded = 0  # 503 server_overloaded: admission rightly full (a category fills it on purpose)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop_event.is_set():
            t0 = time.perf_counter()
            try:
                status, body = request(self.srv, "POST", "/v1/completions", NORMAL, timeout=60)
                if status == 503 and isinstance(body, dict) and body["error"].get("code") == "server_overloaded":
                    self.overloaded += 1
                elif status != 200:
                    self.failures.append(f"{status}: {str(body)[:120]}")
            except OSError as exc:
                self.failures.append(f"{type(exc).__name__}: {exc}")
            self.latencies.append(time.perf_counter() - t0)
            self.stop_event.wait(0.5)

    def __enter__(self) -> Watch:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop_event.set()
        self.thread.join(90)


@dataclass
class Result:
    category: str
    cases: int = 0
    crashes: int = 0
    server_errors: int = 0
    unexpected: list[str] = field(default_factory=list)
    max_normal_s: float = 0.0
    normal_failures: int = 0
    normal_overloaded: int = 0
    rss_before_mib: float = 0.0
    rss_after_mib: float = 0.0
    seconds: float = 0.0


Case = tuple[str, Callable[[Server], tuple[int, Any]], Callable[[int, Any], bool]]


def post(path: str, body: Any = None, **kw: Any) -> Callable[[Server], tuple[int, Any]]:
    return lambda srv: request(srv, "POST", path, body, **kw)


def is_4xx_naming(*params: str) -> Callable[[int, Any], bool]:
    def check(status: int, body: Any) -> bool:
        err = body.get("error", {}) if isinstance(body, dict) else {}
        return 400 <= status < 500 and (not params or err.get("param") in params)

    return check


def status_in(*codes: int) -> Callable[[int, Any], bool]:
    return lambda status, body: status in codes


def chain_grammar(rules: int) -> str:
    return "\n".join(["start: r0"] + [f'r{i}: "a" r{i + 1}' for i in range(rules)] + [f'r{rules}: "b"'])


def cmpl(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "hi", "max_tokens": 2, **extra}


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **extra}


def grammar_cases(sample: bool) -> list[Case]:
    sizes = [3500] if sample else [2000, 3000, 3500, 5000, 10000]
    cases: list[Case] = []
    for n in sizes:
        g = chain_grammar(n)
        cases.append(
            (
                f"lark {n} chained rules",
                post("/v1/completions", cmpl(structured_outputs={"grammar": g})),
                is_4xx_naming("structured_outputs", "structured_outputs.grammar"),
            )
        )
        cases.append(
            (
                f"guided_grammar {n} rules",
                post("/v1/completions", cmpl(guided_grammar=g)),
                is_4xx_naming("guided_grammar"),
            )
        )
    deep = "start: " + "(" * 5000 + '"a"' + ")" * 5000
    cases.append(
        (
            "5,000 nested parentheses",
            post("/v1/completions", cmpl(guided_grammar=deep)),
            is_4xx_naming("guided_grammar"),
        )
    )
    props = {f"p{i}": {"type": "integer"} for i in range(10_000)}
    schema = {"type": "object", "properties": props}
    cases.append(
        (
            "10,000-property schema",
            post(
                "/v1/completions",
                cmpl(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}),
            ),
            is_4xx_naming("response_format"),
        )
    )
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    cases.append(
        (
            "10,000-property tool (required)",
            post("/v1/chat/completions", chat(tools=[tool], tool_choice="required")),
            is_4xx_naming("tool_choice"),
        )
    )
    nested: dict[str, Any] = {"type": "string"}
    for _ in range(200):
        nested = {"type": "object", "properties": {"x": nested}}
    cases.append(
        ("schema nested 200 deep", post("/v1/completions", cmpl(guided_json=nested)), is_4xx_naming("guided_json"))
    )
    cases.append(
        (
            "regex 3,000 nested groups",
            post("/v1/completions", cmpl(guided_regex="(" * 3000 + "a" + ")" * 3000)),
            is_4xx_naming("guided_regex"),
        )
    )
    if not sample:
        cases.append(("catastrophic regex", post("/v1/completions", cmpl(guided_regex="(a+)+$")), status_in(200, 400)))
        cases.append(
            (
                "2,000 choices",
                post("/v1/completions", cmpl(guided_choice=[f"c{i}" for i in range(2000)])),
                is_4xx_naming("guided_choice"),
            )
        )
        cases.append(
            ("valid small grammar", post("/v1/completions", cmpl(guided_grammar=chain_grammar(20))), status_in(200))
        )
    return cases


LOOPS3 = (
    "{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}{% endfor %}{% endfor %}{% endfor %}"
)
LOOPS4 = "{% for d in range(1000) %}" + LOOPS3 + "{% endfor %}"


def template_cases(sample: bool) -> list[Case]:
    templates = {
        "3 nested range(1000)": LOOPS3,
        "'a' * 1e9": "{% set s = 'a' * 1000000000 %}{{ s }}",
        "10 MB output": "{{ 'x' * 10000000 }}",
    }
    if not sample:
        templates.update(
            {
                "4 nested range(1000)": LOOPS4,
                "recursive macro": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
                "range(10**9)": "{% for i in range(1000000000) %}{% endfor %}",
                "raise_exception": "{{ raise_exception('no') }}",
                "attribute escape": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
            }
        )
    cases: list[Case] = []
    for name, t in templates.items():
        cases.append((f"chat: {name}", post("/v1/chat/completions", chat(chat_template=t)), is_4xx_naming("messages")))
        if not sample:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "chat_template": t}
            cases.append((f"/tokenize: {name}", post("/tokenize", body), is_4xx_naming("messages")))
    return cases


def unicode_cases(sample: bool) -> list[Case]:
    cases: list[Case] = [
        (f"{path} {param} = \\ud800", post(path, raw=raw), is_4xx_naming(param))
        for path, raw, param in surrogate_cases(MODEL)
    ]
    for key in ["\u00b2", "\u0663", "1e3", "-1"]:
        cases.append(
            (f"logit_bias key {key!r}", post("/v1/completions", cmpl(logit_bias={key: 1})), is_4xx_naming("logit_bias"))
        )
    return cases[:4] if sample else cases


ROUTES = [
    ("GET", "/v1/models", None),
    ("POST", "/v1/completions", cmpl()),
    ("POST", "/v1/chat/completions", chat()),
    ("POST", "/tokenize", {"prompt": "hi"}),
    ("POST", "/detokenize", {"tokens": [1, 2]}),
    ("GET", "/version", None),
    ("GET", "/health", None),
    ("GET", "/metrics", None),
    ("GET", "/openapi.json", None),
    ("GET", "/docs", None),
    ("GET", "/v1/models/probe", None),
    ("GET", "/nope", None),
    ("DELETE", "/v1/models", None),
    ("POST", "/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 2}),
    ("GET", "/v1/responses/resp_x", None),
    ("POST", "/v1/messages", {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}),
    ("POST", "/v1/messages/count_tokens", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}),
]
OPEN = {"/health", "/version", "/metrics"}


def auth_cases(sample: bool) -> list[Case]:
    cases: list[Case] = []
    for method, path, body in ROUTES[: 5 if sample else None]:
        for variant, header in (("no key", None), ("wrong key", "Bearer nope"), ("lower-case bearer", f"bearer {KEY}")):
            expect_ok = path in OPEN or variant == "lower-case bearer"

            def check(status: int, answer: Any, expect_ok: bool = expect_ok) -> bool:
                return status != 401 if expect_ok else status == 401

            hdr = {"authorization": header} if header else {}
            cases.append(
                (
                    f"{method} {path} ({variant})",
                    lambda srv, m=method, p=path, b=body, h=hdr: request(srv, m, p, b, headers=h, key=None),
                    check,
                )
            )
    cases.append(
        (
            "GET /v1/completions -> 405 with Allow",
            lambda srv: _allow(srv),
            lambda status, body: status == 405 and body == "POST",
        )
    )
    return cases


def _allow(srv: Server) -> tuple[int, Any]:
    req = urllib.request.Request(srv.base + "/v1/completions", headers={"authorization": f"Bearer {KEY}"})
    try:
        urllib.request.urlopen(req, timeout=10)
        return 200, None
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("allow")


def http_cases(sample: bool) -> list[Case]:
    cases: list[Case] = [
        ("malformed JSON", post("/v1/completions", raw=b'{"model": '), is_4xx_naming()),
        ("10^5-deep JSON", post("/v1/completions", raw=b"[" * 100_000 + b"]" * 100_000), is_4xx_naming()),
        ("2 MB body", post("/v1/completions", raw=b" " * (2 << 20)), status_in(413)),
        ("n=99", post("/v1/completions", cmpl(n=99)), is_4xx_naming("n")),
        ("max_tokens past the limit", post("/v1/completions", cmpl(max_tokens=10**9)), is_4xx_naming("max_tokens")),
    ]
    return cases[:3] if sample else cases


def _raw_socket(srv: Server) -> socket.socket:
    return socket.create_connection((HOST, srv.port), timeout=10)


def slowloris(srv: Server, count: int, hold_s: float) -> tuple[int, Any]:
    """`count` connections sending a header byte every second; how many the server closed within hold_s."""
    socks = []
    for _ in range(count):
        try:
            s = _raw_socket(srv)
            s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n")
            socks.append(s)
        except OSError:
            break
    closed: set[int] = set()
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline and len(closed) < len(socks):
        for i, s in enumerate(socks):
            if i in closed:
                continue
            try:
                s.sendall(b"x")
                s.setblocking(False)
                try:
                    if s.recv(1) == b"":
                        closed.add(i)
                except BlockingIOError:
                    pass
                finally:
                    s.setblocking(True)
            except OSError:
                closed.add(i)
        time.sleep(1.0)
    for s in socks:
        s.close()
    return 200, {"opened": len(socks), "closed": len(closed)}


def _gauges(srv: Server) -> dict[str, float]:
    text = request(srv, "GET", "/metrics", key=None)[1]
    out: dict[str, float] = {}
    for ln in str(text).splitlines():
        if ln.startswith(("keel_num_", "vllm:num_")):
            out[ln.split("{")[0]] = float(ln.rsplit(" ", 1)[1])
    return out


def non_reader(srv: Server, wait_s: float) -> tuple[int, Any]:
    """One n=16 stream with 20 logprobs per token, never read (4 KB receive buffer), fills admission
    (--max-num-seqs 4 + --max-waiting 12). Once the engine is done with it, 15 other requests must be
    served (its slots are free), and past the send timeout its stream is closed."""
    body = json.dumps(
        {"model": MODEL, "prompt": "hi", "max_tokens": 30, "n": 16, "stream": True, "logprobs": 20, "ignore_eos": True}
    ).encode()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect((HOST, srv.port))
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer " + KEY.encode() + b"\r\ncontent-length: %d\r\n\r\n" % len(body) + body
    )
    deadline = time.monotonic() + 120
    started = False
    while time.monotonic() < deadline:  # the engine works on it (its slots are rightly taken meanwhile)
        g = _gauges(srv)
        busy = g.get("vllm:num_requests_running", 0) + g.get("vllm:num_requests_waiting", 0)
        started = started or busy > 0
        if started and busy == 0:
            break
        time.sleep(0.2)
    results: list[int] = []

    def one() -> None:
        results.append(request(srv, "POST", "/v1/completions", NORMAL, timeout=120)[0])

    threads = [threading.Thread(target=one) for _ in range(15)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    deadline = time.monotonic() + wait_s
    freed = False
    while time.monotonic() < deadline:
        g = _gauges(srv)
        if g.get("keel_num_streams_open", 1) == 0 and g.get("keel_num_requests_admitted", 1) == 0:
            freed = True
            break
        time.sleep(0.5)
    s.close()
    return 200, {"others": sorted(results), "freed": freed}


def slow_clients_cases(sample: bool) -> list[Case]:
    n = 20 if sample else 200
    return [
        (
            f"{n} slowloris connections",
            lambda srv: slowloris(srv, n, 15),
            lambda status, r: r["opened"] == n and r["closed"] == n,
        ),
        (
            "n=16 stream never read",
            lambda srv: non_reader(srv, 60),
            lambda status, r: r["freed"] and all(c == 200 for c in r["others"]),
        ),
        ("body slower than the body timeout", lambda srv: _slow_body(srv), status_in(408)),
    ]


def _slow_body(srv: Server) -> tuple[int, Any]:
    s = _raw_socket(srv)
    try:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nauthorization: "
            b"Bearer " + KEY.encode() + b"\r\ncontent-length: 100\r\n\r\n{"
        )
        s.settimeout(30)
        head = s.recv(200)
        return int(head.split()[1]), head[:60].decode(errors="replace")
    finally:
        s.close()


def patterns_schema(n: int, hidden: bool = False) -> dict[str, Any]:
    """A string matching n `.*x.*` patterns at once (their intersection grows exponentially); `hidden` puts
    them behind `$ref`s, past the static count, for the worker's limits to stop."""
    letters = string.ascii_letters[:n]
    if not hidden:
        return {"type": "string", "allOf": [{"pattern": f".*{c}.*"} for c in letters]}
    defs = {f"d{i}": {"pattern": f".*{c}.*"} for i, c in enumerate(letters)}
    return {"$defs": defs, "type": "string", "allOf": [{"$ref": f"#/$defs/d{i}"} for i in range(n)]}


def schema_cmpl(schema: dict[str, Any]) -> dict[str, Any]:
    return cmpl(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})


def eight_slow_then_small(srv: Server) -> tuple[int, Any]:
    """Eight compiles that run into the workers' limits at once, then a small grammar: it must compile."""
    answers: list[int] = []
    slow = [
        threading.Thread(
            target=lambda: answers.append(
                request(srv, "POST", "/v1/completions", schema_cmpl(patterns_schema(18, True)))[0]
            )
        )
        for _ in range(8)
    ]
    for t in slow:
        t.start()
    for t in slow:
        t.join(120)
    t0 = time.monotonic()
    status, body = request(srv, "POST", "/v1/completions", cmpl(max_tokens=3, guided_choice=["yes", "no"]))
    return status, {"slow": sorted(answers), "small_s": round(time.monotonic() - t0, 2), "body": body}


def _ids(srv: Server, text: str) -> list[int]:
    return list(request(srv, "POST", "/tokenize", {"prompt": text, "add_special_tokens": False})[1]["tokens"])


def masks_emptied_later(srv: Server) -> tuple[int, Any]:
    """allowed [t] with the bad word "tt" (t a digit's one token): t is sampled, then banned, and nothing is
    left at the second step; the answer must be the client's 400, not an engine 500."""
    for digit in "7135":
        (t,), pair = _ids(srv, digit), _ids(srv, digit * 2)
        if pair == [t, t]:
            body = cmpl(max_tokens=4, allowed_token_ids=[t], bad_words=[digit * 2])
            return request(srv, "POST", "/v1/completions", body)
    return 400, {"error": {"param": "allowed_token_ids", "message": "skipped: no digit tokenizes one by one"}}


def untrusted_cases(sample: bool) -> list[Case]:
    deep_args = "[" * 100_000 + "]" * 100_000
    tool_turn = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": deep_args}}]},
        {"role": "tool", "tool_call_id": "c", "content": "ok"},
    ]
    arg_field = "messages.1.tool_calls.0.function.arguments"
    digits = "7" * 1_000_000
    cases: list[Case] = [
        (
            "allOf of 30 patterns",
            post("/v1/completions", schema_cmpl(patterns_schema(30))),
            is_4xx_naming("response_format"),
        ),
        (
            "allOf of 18 patterns behind $ref (worker limit)",
            post("/v1/completions", schema_cmpl(patterns_schema(18, True))),
            is_4xx_naming("response_format"),
        ),
        ("1 MB prompt of digits", post("/v1/completions", cmpl(prompt=digits)), is_4xx_naming("prompt")),
        ("/tokenize 1 MB of digits", post("/tokenize", {"prompt": digits}), is_4xx_naming("prompt")),
        (
            "bad_words: 1,000 words of 1,000 digits, n=16",
            post("/v1/completions", cmpl(n=16, bad_words=["7" * 1000] * 1000)),
            is_4xx_naming("bad_words"),
        ),
        ("masks empty at the second token", masks_emptied_later, is_4xx_naming("allowed_token_ids")),
        (
            "tool arguments 100,000 deep (chat)",
            post("/v1/chat/completions", chat(messages=tool_turn)),
            is_4xx_naming(arg_field),
        ),
        (
            "tool arguments 100,000 deep (/tokenize)",
            post("/tokenize", {"model": MODEL, "messages": tool_turn}),
            is_4xx_naming(arg_field),
        ),
    ]
    if not sample:

        def stop_only(srv: Server) -> tuple[int, Any]:
            t = _ids(srv, "7")
            body = cmpl(max_tokens=4, min_tokens=2, allowed_token_ids=t, stop_token_ids=t)
            return request(srv, "POST", "/v1/completions", body)

        cases += [
            ("min_tokens with only a stop token allowed", stop_only, is_4xx_naming("min_tokens")),
            (
                "a grammar allowing none of allowed_token_ids",
                lambda srv: request(
                    srv, "POST", "/v1/completions", cmpl(allowed_token_ids=_ids(srv, "7"), guided_choice=["yes", "no"])
                ),
                is_4xx_naming("allowed_token_ids"),
            ),
            (
                "eight slow compiles, then a small grammar",
                eight_slow_then_small,
                lambda status, r: status == 200 and all(c in (400, 503) for c in r["slow"]),
            ),
        ]
    return cases


def resp(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": "hi", "max_output_tokens": 2, **extra}


def msg(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], **extra}


def anthropic_error(status: int, body: Any) -> bool:
    return 400 <= status < 500 and isinstance(body, dict) and body.get("type") == "error"


def agents_cases(sample: bool) -> list[Case]:
    """/v1/responses and /v1/messages: the grammar, template, depth and size bounds reached through their fields,
    and the refusals of what they do not take."""
    cases = _agents_bound_cases() + _agents_refusal_cases()
    return cases[:5] if sample else cases


def _agents_bound_cases() -> list[Case]:
    slow = patterns_schema(30)
    tool = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"a": slow}}}
    deep_input = b"[" * 100_000 + b"]" * 100_000
    deep_use = b'{"type":"tool_use","id":"t","name":"f","input":{"a":' + deep_input + b"}}"
    deep_msg = b'{"model":"probe","max_tokens":2,"messages":[{"role":"assistant","content":[' + deep_use + b"]}]}"
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "[" * 100_000 + "]" * 100_000}
    cases: list[Case] = [
        (
            "responses text.format: 30 intersected patterns",
            post("/v1/responses", resp(text={"format": {"type": "json_schema", "name": "x", "schema": slow}})),
            is_4xx_naming("text.format"),
        ),
        ("messages tool_use input 10^5 deep", post("/v1/messages", raw=deep_msg), anthropic_error),
        (
            "responses function_call arguments 10^5 deep",
            post("/v1/responses", resp(input=[call])),
            is_4xx_naming("input.0.arguments"),
        ),
        (
            "count_tokens: a 900 KB system prompt",
            post(
                "/v1/messages/count_tokens",
                {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "system": "a " * 450_000},
            ),
            anthropic_error,
        ),
        (
            "GET /v1/responses/<300 characters>",
            lambda srv: request(srv, "GET", "/v1/responses/" + "x" * 300),
            is_4xx_naming(),
        ),
        (
            "responses tool_choice required: 30 intersected patterns",
            post("/v1/responses", resp(tools=[tool], tool_choice="required")),
            is_4xx_naming("tool_choice"),
        ),
        (
            "messages tool_choice any, streamed: 30 intersected patterns",
            post(
                "/v1/messages",
                msg(
                    tools=[{"name": "f", "input_schema": tool["parameters"]}], tool_choice={"type": "any"}, stream=True
                ),
            ),
            anthropic_error,
        ),
        (
            "responses: a 900 KB instruction",
            post("/v1/responses", resp(instructions="a" * 900_000)),
            is_4xx_naming("input"),
        ),
    ]
    return cases


def _agents_refusal_cases() -> list[Case]:
    return [
        (
            "responses previous_response_id unknown",
            post("/v1/responses", resp(previous_response_id="resp_x")),
            is_4xx_naming("previous_response_id"),
        ),
        (
            "responses item_reference unknown",
            post("/v1/responses", resp(input=[{"type": "item_reference", "id": "x"}])),
            is_4xx_naming("input.0.id"),
        ),
        (
            "responses input_image part",
            post(
                "/v1/responses",
                resp(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "file:///etc/passwd"}]}]),
            ),
            is_4xx_naming("input.0.content.0.type"),
        ),
        (
            "messages image block",
            post(
                "/v1/messages",
                msg(
                    messages=[
                        {
                            "role": "user",
                            "content": [{"type": "image", "source": {"type": "url", "url": "file:///etc/passwd"}}],
                        }
                    ]
                ),
            ),
            anthropic_error,
        ),
        (
            "messages 17 stop sequences",
            post("/v1/messages", msg(stop_sequences=[str(i) for i in range(17)])),
            anthropic_error,
        ),
        (
            "messages wrong x-api-key",
            lambda srv: request(srv, "POST", "/v1/messages", msg(), headers={"x-api-key": "nope"}, key=None),
            lambda status, body: status == 401 and anthropic_error(status, body),
        ),
        ("DELETE /v1/responses/<unknown>", lambda srv: request(srv, "DELETE", "/v1/responses/resp_x"), status_in(404)),
        ("cancel /v1/responses/<unknown>", post("/v1/responses/resp_x/cancel", {}), status_in(404)),
    ]


CATEGORIES: dict[str, Callable[[bool], list[Case]]] = {
    "grammars and schemas": grammar_cases,
    "chat templates": template_cases,
    "invalid Unicode, odd keys": unicode_cases,
    "API key and routes": auth_cases,
    "malformed HTTP and JSON": http_cases,
    "slow and non-reading clients": slow_clients_cases,
    "untrusted input in bounded places": untrusted_cases,
    "agents' APIs (responses, messages)": agents_cases,
}


def run_category(srv: Server, name: str, cases: list[Case], case_timeout: float) -> Result:
    res = Result(name, rss_before_mib=srv.rss_mib())
    t0 = time.monotonic()
    with Watch(srv) as watch:
        for label, send, check in cases:
            if not srv.alive():
                res.crashes += 1
                res.unexpected.append(f"{label}: the server is gone")
                break
            res.cases += 1
            try:
                status, body = send(srv)
            except OSError as exc:
                status, body = -1, f"{type(exc).__name__}: {exc}"
            if not srv.alive():
                res.crashes += 1
                res.unexpected.append(f"{label}: the server died (exit {srv.proc.returncode})")
                break
            if status >= 500:
                res.server_errors += 1
            if not check(status, body):
                res.unexpected.append(f"{label}: {status} {str(body)[:160]}")
        time.sleep(1.0)  # one more normal request after the last case
    res.max_normal_s = max(watch.latencies, default=float("nan"))
    res.normal_failures = len(watch.failures)
    res.normal_overloaded = watch.overloaded
    res.unexpected += [f"normal request during the category: {f}" for f in watch.failures[:3]]
    res.rss_after_mib = srv.rss_mib()
    res.seconds = time.monotonic() - t0
    return res


def table(results: list[Result]) -> str:
    rows = [
        "| category | cases | crashes | 5xx | unexpected | max normal latency (s) | normal failed | normal 503 full "
        "| RSS before (MiB) | RSS after (MiB) | time (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        rows.append(
            f"| {r.category} | {r.cases} | {r.crashes} | {r.server_errors} | {len(r.unexpected)} | "
            f"{r.max_normal_s:.2f} | {r.normal_failures} | {r.normal_overloaded} | "
            f"{r.rss_before_mib:.0f} | {r.rss_after_mib:.0f} | "
            f"{r.seconds:.0f} |"
        )
    total = Result(
        "total", sum(r.cases for r in results), sum(r.crashes for r in results), sum(r.server_errors for r in results)
    )
    rows.append(
        f"| **total** | {total.cases} | {total.crashes} | {total.server_errors} | "
        f"{sum(len(r.unexpected) for r in results)} | {max((r.max_normal_s for r in results), default=0):.2f}"
        f" | {sum(r.normal_failures for r in results)} | {sum(r.normal_overloaded for r in results)} | | "
        f"| {sum(r.seconds for r in results):.0f} |"
    )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="checkpoint folder or GGUF for keel serve --model")
    ap.add_argument("--sample", action="store_true", help="a few cases per category (the test suite's run)")
    ap.add_argument("--only", action="append", default=[], help="run only categories whose name contains this")
    ap.add_argument("--json", default=None, help="write the results as JSON here")
    ap.add_argument("--case-timeout", type=float, default=60.0)
    ap.add_argument(
        "--baseline", action="store_true", help="probe a keel serve older than its limit flags (none of them passed)"
    )
    ap.add_argument("serve_args", nargs="*", help="extra keel serve arguments (after --)")
    args = ap.parse_args(argv)
    srv = Server(args.model, list(args.serve_args), args.baseline)
    srv.start()
    restarts = 0
    results: list[Result] = []
    try:
        for name, make in CATEGORIES.items():
            if args.only and not any(o in name for o in args.only):
                continue
            results.append(run_category(srv, name, make(args.sample), args.case_timeout))
            print(f"{name}: {results[-1].cases} cases, {len(results[-1].unexpected)} unexpected", file=sys.stderr)
            if not srv.alive():  # a crash: start a fresh server for the next category (counted in the table)
                restarts += 1
                srv = Server(args.model, list(args.serve_args), args.baseline)
                srv.start()
    finally:
        alive = srv.alive()
        code = srv.stop()
    print(table(results))
    for r in results:
        for u in r.unexpected:
            print(f"- {r.category}: {u}")
    print(f"\nserver alive at the end: {alive}; SIGTERM exit status: {code}; restarts after a crash: {restarts}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"results": [r.__dict__ for r in results], "alive": alive, "exit": code}, indent=1)
        )
    bad = any(r.crashes or r.server_errors or r.unexpected for r in results) or not alive or code != 0 or restarts
    if bad and not alive:
        print(srv.tail(), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
