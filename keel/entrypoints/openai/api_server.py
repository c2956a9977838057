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
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from keel.engine.async_engine import AsyncEngine, Drained
from keel.engine.sampling_params import SamplingParams
from keel.entrypoints.openai.chat_completion.api_router import router as chat_router
from keel.entrypoints.openai.chat_completion.serving import OpenAIServingChat
from keel.entrypoints.openai.completion.api_router import router as completion_router
from keel.entrypoints.openai.completion.serving import OpenAIServingCompletion
from keel.entrypoints.openai.errors import APIError, install_handlers, log
from keel.entrypoints.openai.models.api_router import router as models_router
from keel.entrypoints.openai.serving_engine import OpenAIServing, ServingConfig
from keel.entrypoints.openai.stats import PROMETHEUS_CONTENT_TYPE, metrics_registry, render_prometheus
from keel.entrypoints.openai.tokenize.api_router import router as tokenize_router


@dataclass(slots=True)
class ServerLimits:
    """Admission and size limits of the HTTP layer."""

    max_body_bytes: int = 1 << 20
    max_tokens: int = 4096  # per request (max_tokens / max_completion_tokens)
    max_waiting: int = 256  # requests queued beyond the engine's running batch before 503
    max_model_len: int | None = None  # prompt + completion tokens; None: the model's context

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"ServerLimits: {name} must be >= 1, got {getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"ServerLimits: max_model_len must be >= 2, got {self.max_model_len}")
        if self.max_waiting < 0:
            raise ValueError(f"ServerLimits: max_waiting must be >= 0, got {self.max_waiting}")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None) -> None:
    """Refuse to listen beyond this machine without an API key."""
    if not is_loopback(host) and not api_key:
        raise ValueError(
            f"keel serve: --host {host} is reachable from other machines; set --api-key (or KEEL_API_KEY) "
            f"to bind there, or keep the default --host 127.0.0.1"
        )


async def _send_error(send: Send, err: APIError) -> None:
    body = json.dumps(err.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if err.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """Pure ASGI middleware (streaming-safe): Bearer API key on /v1/*, and a request body size limit."""

    def __init__(self, app: ASGIApp, api_key: str | None, max_body_bytes: int, serving: Any = None) -> None:
        self.app, self.api_key, self.max_body_bytes, self.serving = app, api_key, max_body_bytes, serving

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.serving is not None and self.serving.draining and scope["path"] not in ("/metrics", "/version"):
            what = "draining" if scope["path"] == "/health" else "refusing new requests"
            await _send_error(
                send,
                APIError(503, f"the server is shutting down ({what}); retry on another replica", code="shutting_down"),
            )
            return
        headers = dict(scope.get("headers") or [])
        if self.api_key and scope["path"].startswith("/v1"):
            given = headers.get(b"authorization", b"").decode("latin-1")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
                await _send_error(
                    send,
                    APIError(
                        401, "Incorrect or missing API key: send `Authorization: Bearer <key>`", code="invalid_api_key"
                    ),
                )
                return
        limit = self.max_body_bytes
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            if int(declared) <= 64 * limit:  # read and drop it, so the client sees the answer, not a reset
                while (await receive()).get("more_body"):
                    pass
            await _send_error(send, _too_large(limit))
            return
        seen = 0

        async def limited() -> MutableMapping[str, Any]:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:  # chunked bodies carry no content-length: count as they come
                    raise HTTPException(413, _too_large(limit).message)
            return message

        await self.app(scope, limited, send)


def _too_large(limit: int) -> APIError:
    return APIError(
        413, f"the request body is larger than this server's limit of {limit} bytes", code="request_too_large"
    )


def build_app(
    engine: AsyncEngine,
    *,
    model_name: str,
    api_key: str | None = None,
    limits: ServerLimits | None = None,
    require_warm_up: bool = False,
) -> FastAPI:
    """The OpenAI-compatible app over a running `AsyncEngine` (whose `engine` is an `LLMEngine`).

    With `require_warm_up` (what `keel serve` does) the app is not ready (`GET /v1/models` 503, code
    `not_ready`) until the engine has run a step: `run_server` sends a one-token request at start, so a
    readiness probe passes only once a request has really gone through the model."""
    limits = limits or ServerLimits()
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
    )
    app = FastAPI(title="keel serve", summary="OpenAI-compatible API of keel", version="0.1.0")
    install_handlers(app)
    serving = OpenAIServing(engine, llm.tokenizer, cfg)
    app.state.engine, app.state.serving, app.state.started = engine, serving, int(time.time())
    app.state.ready, app.state.warm_up = not require_warm_up, None
    app.state.completion, app.state.chat = OpenAIServingCompletion(serving), OpenAIServingChat(serving)
    for router in (completion_router, chat_router, models_router, tokenize_router):
        app.include_router(router)

    @app.get("/health")
    async def health(raw: Request) -> JSONResponse:
        eng: AsyncEngine = raw.app.state.engine
        if not eng.alive:
            return APIError(503, f"the engine thread has stopped: {eng.error!r}").response()
        return JSONResponse({"status": "ok"})

    registry = metrics_registry(model_name, engine, serving.stats, llm.runner.block_size)

    @app.get("/metrics")
    async def metrics(raw: Request) -> Response:
        return Response(render_prometheus(registry), media_type=PROMETHEUS_CONTENT_TYPE)

    return Guard(app, api_key, limits.max_body_bytes, serving)  # type: ignore[return-value]


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


def is_ready(app: FastAPI) -> bool:
    """Readiness: the model is loaded (it is, once the app exists) and the engine has run a step. The
    first call on an app that is not ready starts the warm-up request (`warm_up`) if nothing did."""
    if app.state.ready:
        return True
    if app.state.engine.steps > 0:
        app.state.ready = True
        return True
    start_warm_up(app)
    return False


def start_warm_up(app: FastAPI) -> None:
    """Start the warm-up request once, on the running event loop."""
    if app.state.warm_up is None and not app.state.ready:
        app.state.warm_up = asyncio.ensure_future(warm_up(app))


async def warm_up(app: FastAPI) -> None:
    """One greedy one-token request through the engine (so the first client does not pay the first step's
    one-time costs, and readiness means a request has gone through the model)."""
    engine: AsyncEngine = app.state.engine
    try:
        stream = await engine.open(["keel-warm-up"], [[0]], [SamplingParams(max_tokens=1)])
        try:
            async for _ in stream:
                pass
        finally:
            stream.close()
    except Exception as exc:  # the engine is broken: /health says so; stay unready and say why in the log
        log.error("keel serve: the warm-up request failed: %r", exc)
        return
    app.state.ready = True


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
            start_warm_up(self.config.app.app)  # the Guard's FastAPI app
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


def run_server(app: Any, *, host: str, port: int, log_level: str, shutdown_timeout_s: float = 30.0) -> int:
    """Serve in the foreground until SIGTERM / SIGINT, drain, and return the exit status (0)."""
    import uvicorn

    guard = app
    serving = guard.serving
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="off", timeout_graceful_shutdown=5)
    server = _uvicorn_server()(config, serving, shutdown_timeout_s)
    server.run()
    if server.ended:
        log.warning("keel serve: ended %d request(s) still running at the shutdown timeout", server.ended)
    return 0


def make_async_engine(llm: Any, limits: ServerLimits, max_num_seqs: int) -> AsyncEngine:
    return AsyncEngine(llm, max_admitted=max_num_seqs + limits.max_waiting)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerThread:
    """uvicorn serving `app` on a loopback port in a daemon thread; `stop()` shuts it down."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int | None = None, log_level: str = "warning") -> None:
        import uvicorn

        self.host, self.port = host, port or free_port(host)
        config = uvicorn.Config(
            app, host=self.host, port=self.port, log_level=log_level, lifespan="off", timeout_graceful_shutdown=5
        )
        self.server = uvicorn.Server(config)
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
