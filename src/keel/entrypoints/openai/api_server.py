"""The FastAPI app of `keel serve`, its guard middleware (API key, body size), and how it is run.

`build_app` wires an `AsyncEngine` to the endpoint routers; `DrainingServer` runs it with uvicorn in
the foreground (the CLI) and drains on SIGTERM / SIGINT (`drain`); `ServerThread` runs it on a free
loopback port in a background thread (tests and benchmarks). Binding anywhere but loopback requires
an API key (`check_bind`).

Drain: /health answers 503 at once and new requests get 503 (the load balancer moves on), running
requests get up to the shutdown timeout to finish; streams still open then end with an OpenAI error
chunk and `data: [DONE]`, non-streamed ones with a 503, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import socket
import threading
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from keel.engine.async_engine import AsyncEngine, Drained
from keel.entrypoints.anthropic.api_router import router as messages_router
from keel.entrypoints.anthropic.serving import AnthropicServingMessages
from keel.entrypoints.openai.chat_completion.api_router import router as chat_router
from keel.entrypoints.openai.chat_completion.serving import OpenAIServingChat
from keel.entrypoints.openai.chat_utils import TemplateRenderer
from keel.entrypoints.openai.completion.api_router import router as completion_router
from keel.entrypoints.openai.completion.serving import OpenAIServingCompletion
from keel.entrypoints.openai.errors import ANTHROPIC_PATHS, APIError, anthropic_body, install_handlers, log
from keel.entrypoints.openai.models.api_router import router as models_router
from keel.entrypoints.openai.openapi import install_openapi
from keel.entrypoints.openai.readiness import start_warm_up
from keel.entrypoints.openai.responses.api_router import router as responses_router
from keel.entrypoints.openai.responses.serving import OpenAIServingResponses
from keel.entrypoints.openai.responses.store import ResponseStore
from keel.entrypoints.openai.server_config import ServerConfig
from keel.entrypoints.openai.serving_engine import OpenAIServing, ServingConfig
from keel.entrypoints.openai.stats import PROMETHEUS_CONTENT_TYPE, metrics_registry, render_prometheus
from keel.entrypoints.openai.tokenize.api_router import router as tokenize_router
from keel.structured.grammar import GrammarLimits


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_api_key(api_key: str | None) -> None:
    """Refuse at start a key no client could ever send: HTTP header values are ASCII, and a header's
    surrounding whitespace is not part of its value."""
    if not api_key:  # unset or empty: no key
        return
    bad = [c for c in api_key if not " " <= c <= "~"]
    if bad:
        raise ValueError(
            f"keel serve: --api-key (or KEEL_API_KEY) must be printable ASCII (a header value), but it holds "
            f"{len(bad)} other character(s), first {bad[0]!r}"
        )
    if api_key != api_key.strip():
        raise ValueError(
            "keel serve: --api-key (or KEEL_API_KEY) starts or ends with whitespace, which no client can send "
            "(HTTP drops it from header values); remove it"
        )


# paths that answer without the API key: liveness for load balancers, the version, metrics (no paths on disk)
OPEN_PATHS = frozenset({"/health", "/version", "/metrics"})


def key_matches(header: bytes, api_key: str, x_api_key: bytes = b"") -> bool:
    """`Authorization: Bearer <key>`, the scheme case-insensitive (RFC 9110), or `x-api-key: <key>` (Anthropic's
    header); the key compared in constant time."""
    if x_api_key and hmac.compare_digest(x_api_key.strip(), api_key.encode()):
        return True
    scheme, _, token = header.decode("latin-1").strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode("latin-1"), api_key.encode())


def metrics_label(model_name: str) -> str:
    """The model label /metrics shows (it answers without the key): the served name, or when that is a path
    on disk (`--model /some/folder` without `--served-model-name`), only the folder's own name."""
    path = Path(model_name).expanduser()
    if path.is_absolute() or model_name.startswith((".", "~")) or path.exists():
        return path.name or "model"
    return model_name


def check_bind(host: str, api_key: str | None) -> None:
    """Refuse to listen beyond this machine without an API key, and a key no client can send."""
    check_api_key(api_key)
    if not is_loopback(host) and not api_key:
        raise ValueError(
            f"keel serve: --host {host} is reachable from other machines; set --api-key (or KEEL_API_KEY) "
            f"to bind there, or keep the default --host 127.0.0.1"
        )


async def _send_error(send: Send, err: APIError, path: str = "") -> None:
    body = json.dumps(anthropic_body(err) if path.startswith(ANTHROPIC_PATHS) else err.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if err.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class SendTimeout(BaseException):
    """The client did not take a response write within the send timeout (it stopped reading). A
    BaseException, like a cancellation: the app's `except Exception` handlers (which would try to send a
    500 on a response already started) let it through to `Guard`."""


class Guard:
    """Pure ASGI middleware (streaming-safe): Bearer API key on every path but `OPEN_PATHS`, a request body
    size limit, a body timeout, and a send timeout: a write the client does not take within
    `send_timeout_s` (it stopped reading) ends the response, so a streaming request is aborted (its
    admission slots and KV blocks freed) and its connection dropped."""

    def __init__(
        self,
        app: ASGIApp,
        api_key: str | None,
        max_body_bytes: int,
        serving: Any = None,
        *,
        send_timeout_s: float = 30.0,
        body_timeout_s: float = 30.0,
    ) -> None:
        self.app, self.api_key, self.max_body_bytes, self.serving = app, api_key, max_body_bytes, serving
        self.send_timeout_s, self.body_timeout_s = send_timeout_s, body_timeout_s
        self.num_send_timeouts = 0
        self.limits = ServerConfig()  # build_app sets the server's: uvicorn's connection options come from it
        self.on_close: list[Any] = []  # called by close(): the template workers

    def close(self) -> None:
        for fn in self.on_close:
            fn()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.serving is not None and self.serving.draining and scope["path"] not in ("/metrics", "/version"):
            what = "draining" if scope["path"] == "/health" else "refusing new requests"
            await _send_error(
                send,
                APIError(503, f"the server is shutting down ({what}); retry on another replica", code="shutting_down"),
                scope["path"],
            )
            return
        headers = dict(scope.get("headers") or [])
        if self.api_key and scope["path"] not in OPEN_PATHS:
            if not key_matches(headers.get(b"authorization", b""), self.api_key, headers.get(b"x-api-key", b"")):
                await _send_error(
                    send,
                    APIError(
                        401,
                        "Incorrect or missing API key: send `Authorization: Bearer <key>` (or `x-api-key: <key>`)",
                        code="invalid_api_key",
                    ),
                    scope["path"],
                )
                return
        limit = self.max_body_bytes
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            if int(declared) <= 64 * limit:  # read and drop it, so the client sees the answer, not a reset
                while (await receive()).get("more_body"):
                    pass
            await _send_error(send, _too_large(limit), scope["path"])
            return
        seen = 0
        body_done = False
        body_deadline: float | None = None
        loop = asyncio.get_running_loop()

        async def limited() -> MutableMapping[str, Any]:
            nonlocal seen, body_done, body_deadline
            if body_done:  # after the body: only a disconnect can come, whenever it comes
                return await receive()
            if body_deadline is None:
                body_deadline = loop.time() + self.body_timeout_s
            try:
                message = await asyncio.wait_for(receive(), max(0.0, body_deadline - loop.time()))
            except asyncio.TimeoutError:
                raise HTTPException(
                    408, f"the request body did not arrive within this server's limit of {self.body_timeout_s:g} s"
                ) from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:  # chunked bodies carry no content-length: count as they come
                    raise HTTPException(413, _too_large(limit).message)
                body_done = not message.get("more_body", False)
            return message

        # uvicorn's send is its request cycle's method: its transport can be aborted (a plain close would wait
        # for the client to read what is buffered)
        transport = getattr(getattr(send, "__self__", None), "transport", None)

        async def timed_send(message: MutableMapping[str, Any]) -> None:
            try:
                await asyncio.wait_for(send(message), self.send_timeout_s)
            except asyncio.TimeoutError:
                raise SendTimeout(
                    f"the client took no data for {self.send_timeout_s:g} s (--send-timeout): response ended"
                ) from None

        try:
            await self.app(scope, limited, timed_send)
        except BaseException as caught:
            exc = _send_timeout_in(caught)
            if exc is None:
                raise
            self.num_send_timeouts += 1
            log.warning("keel serve: %s %s: %s", scope.get("method"), scope["path"], exc)
            if transport is not None and hasattr(transport, "abort"):
                transport.abort()


def _send_timeout_in(exc: BaseException) -> SendTimeout | None:
    """The SendTimeout `exc` is or carries (a task group of the streaming response may wrap it)."""
    if isinstance(exc, SendTimeout):
        return exc
    if type(exc).__name__ in ("BaseExceptionGroup", "ExceptionGroup"):  # builtins from Python 3.11
        for inner in getattr(exc, "exceptions", ()):
            found = _send_timeout_in(inner)
            if found is not None:
                return found
    return None


def _too_large(limit: int) -> APIError:
    return APIError(
        413, f"the request body is larger than this server's limit of {limit} bytes", code="request_too_large"
    )


def agents_apis(
    serving: OpenAIServing, limits: ServerConfig
) -> tuple[OpenAIServingResponses, AnthropicServingMessages]:
    """The Responses API (with the store of its responses) and Anthropic's Messages API over the serving layer."""
    store = ResponseStore(limits.response_store_mib << 20, limits.response_store_ttl_s)
    return OpenAIServingResponses(serving, store), AnthropicServingMessages(serving)


def build_app(
    engine: AsyncEngine,
    *,
    model_name: str,
    api_key: str | None = None,
    limits: ServerConfig | None = None,
    trust_request_chat_template: bool = False,
    require_warm_up: bool = False,
) -> FastAPI:
    """The OpenAI-compatible app over a running `AsyncEngine` (whose `engine` is an `LLMEngine`).

    `trust_request_chat_template`: render a request's own `chat_template` (else 400). With
    `require_warm_up` (what `keel serve` does) the app is not ready (`GET /v1/models` 503, code
    `not_ready`) until the engine has run a step: `run_server` sends a one-token request at start, so a
    readiness probe passes only once a request has really gone through the model."""
    limits = limits or ServerConfig()
    check_api_key(api_key)
    llm = engine.engine
    context = llm.config.max_position_embeddings
    if limits.max_model_len is not None and limits.max_model_len > context:
        raise ValueError(
            f"keel serve: --max-model-len {limits.max_model_len} is larger than the model's context ({context} tokens)"
        )
    cfg = ServingConfig(
        model_name=model_name,
        max_model_len=limits.max_model_len or context,
        vocab_size=llm.config.vocab_size,
        max_tokens_limit=limits.max_tokens,
        trust_request_chat_template=trust_request_chat_template,
        tool_call_parser=limits.tool_call_parser,
    )
    app = FastAPI(title="keel serve", summary="OpenAI-compatible API of keel", version="0.1.0")
    install_handlers(app)
    templates = TemplateRenderer(
        workers=limits.template_workers,
        timeout_s=limits.template_timeout_s,
        memory_mib=limits.template_memory_mib,
        max_output_chars=max(1 << 20, 16 * cfg.max_model_len),
    )
    serving = OpenAIServing(engine, llm.tokenizer, cfg, templates, tokenizer_threads=limits.tokenizer_threads)
    serving.keyed = bool(api_key)  # a key the server checks names its caller (client_of)
    serving.grammar_limits = GrammarLimits(
        compile_timeout_s=limits.grammar_timeout_s, workers=limits.grammar_workers, memory_mib=limits.grammar_memory_mib
    )
    app.state.engine, app.state.serving, app.state.started = engine, serving, int(time.time())
    app.state.ready, app.state.warm_up = not require_warm_up, None
    app.state.completion, app.state.chat = OpenAIServingCompletion(serving), OpenAIServingChat(serving)
    app.state.responses, app.state.messages = agents_apis(serving, limits)
    for router in (completion_router, chat_router, responses_router, messages_router, models_router, tokenize_router):
        app.include_router(router)

    @app.get("/health")
    async def health(raw: Request) -> JSONResponse:
        eng: AsyncEngine = raw.app.state.engine
        if not eng.alive:
            return APIError(503, f"the engine thread has stopped: {eng.error!r}").response()
        return JSONResponse({"status": "ok"})

    label = metrics_label(model_name)
    install_openapi(app, max_tokens=limits.max_tokens, vocab_size=cfg.vocab_size, api_key=bool(api_key))
    block_size = getattr(getattr(llm, "engine_config", None), "block_size", 0)  # 0: an engine without a KV pool
    registry = metrics_registry(label, engine, serving.stats, block_size)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics(raw: Request) -> Response:
        return Response(render_prometheus(registry), media_type=PROMETHEUS_CONTENT_TYPE)

    guard = Guard(
        app,
        api_key,
        limits.max_body_bytes,
        serving,
        send_timeout_s=limits.send_timeout_s,
        body_timeout_s=limits.body_timeout_s,
    )
    guard.limits = limits
    guard.on_close.append(serving.close)
    return guard  # type: ignore[return-value]


async def drain(serving: OpenAIServing, timeout_s: float, poll_s: float = 0.05) -> int:
    """Refuse new requests, give running ones `timeout_s` to finish, then end the rest; returns how many
    were ended (their streams get an error chunk and `data: [DONE]`, the others a 503)."""
    serving.draining = True
    engine = serving.engine
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while engine.num_open and loop.time() < deadline:
        await asyncio.sleep(poll_s)
    if not engine.num_open:
        return 0
    ended = engine.end_open(
        Drained(f"the server shut down before this request finished (it waited --shutdown-timeout {timeout_s:g} s)")
    )
    flush = loop.time() + 5.0  # the streams' readers send their error chunk and close
    while engine.num_open and loop.time() < flush:
        await asyncio.sleep(poll_s)
    return ended


def _uvicorn_server() -> type:
    import uvicorn

    class DrainingServer(uvicorn.Server):
        """uvicorn whose first SIGTERM / SIGINT drains (`drain`) before it stops; a second one stops at once."""

        def __init__(self, config: Any, serving: OpenAIServing, shutdown_timeout_s: float) -> None:
            super().__init__(config)
            self.serving, self.shutdown_timeout_s = serving, shutdown_timeout_s
            self.draining = False
            self.ended = 0
            self._loop: asyncio.AbstractEventLoop | None = None

        async def serve(self, sockets: Any = None) -> None:
            self._loop = asyncio.get_running_loop()
            start_warm_up(cast(Any, self.config.app).app)  # the Guard's FastAPI app
            await super().serve(sockets)

        def handle_exit(self, sig: int, frame: Any) -> None:
            # not uvicorn's handler: it would re-raise the signal after shutdown (exit status 143 or a
            # KeyboardInterrupt) where a drained server exits 0
            if self.draining or self._loop is None:
                self.force_exit = self.draining
                self.should_exit = True
                return
            self.draining = True
            self.serving.draining = True  # /health 503 from now on, before the loop wakes
            self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain()))

        async def _drain(self) -> None:
            try:
                self.ended = await drain(self.serving, self.shutdown_timeout_s)
            finally:
                self.should_exit = True

    return DrainingServer


def _header_timed_protocol(header_timeout_s: float) -> type:
    """uvicorn's h11 protocol with a header timeout: a connection whose request headers are not complete
    `header_timeout_s` after it opened (or after its previous response) is closed. uvicorn has none: 200
    connections sending a header byte now and then (slowloris) were held for as long as they liked."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderTimedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderTimedH11Protocol


def uvicorn_config(app: Any, *, host: str, port: int, log_level: str) -> Any:
    """uvicorn's Config for `app` (a `Guard`), its connection limits and timeouts from the app's ServerConfig."""
    import uvicorn

    limits: ServerConfig = getattr(app, "limits", None) or ServerConfig()
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="off",
        timeout_graceful_shutdown=5,
        http=_header_timed_protocol(limits.header_timeout_s),
        timeout_keep_alive=max(1, round(limits.keep_alive_s)),
        limit_concurrency=limits.max_connections,
        h11_max_incomplete_event_size=limits.max_header_bytes,
    )


def run_server(app: Any, *, host: str, port: int, log_level: str, shutdown_timeout_s: float = 30.0) -> int:
    """Serve in the foreground until SIGTERM / SIGINT, drain, and return the exit status (0)."""
    guard = app
    serving = guard.serving
    config = uvicorn_config(app, host=host, port=port, log_level=log_level)
    server = _uvicorn_server()(config, serving, shutdown_timeout_s)
    try:
        server.run()
    finally:
        guard.close()
    if server.ended:
        log.warning("keel serve: ended %d request(s) still running at the shutdown timeout", server.ended)
    return 0


def make_async_engine(build: Callable[[], Any], limits: ServerConfig, max_num_seqs: int) -> AsyncEngine:
    """The server's engine, built by `build()` on its engine thread (AsyncEngine.start says why)."""
    return AsyncEngine.start(build, max_admitted=max_num_seqs + limits.max_waiting)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerThread:
    """uvicorn serving `app` on a loopback port in a daemon thread; `stop()` shuts it down."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int | None = None, log_level: str = "warning") -> None:
        import uvicorn

        self.app = app
        self.host, self.port = host, port or free_port(host)
        self.server = uvicorn.Server(uvicorn_config(app, host=self.host, port=self.port, log_level=log_level))
        self.loop = asyncio.new_event_loop()  # the server's loop, for callers that inspect its tasks
        self.thread = threading.Thread(target=self._run, name="keel-serve", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.server.serve())
        finally:
            self.loop.close()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"keel serve: the server did not start on {self.base_url}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        close = getattr(self.app, "close", None)
        if close is not None:
            close()
