"""The FastAPI app of `keel serve`, its guard middleware (API key, body size), and how it is run.

`build_app` wires an `AsyncEngine` to the endpoint routers; `serve` runs it with uvicorn in the
foreground (the CLI); `ServerThread` runs it on a free loopback port in a background thread (tests
and benchmarks). Binding anywhere but loopback requires an API key (`check_bind`).
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
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from keel.engine.async_engine import AsyncEngine
from keel.entrypoints.openai.chat_completion.api_router import router as chat_router
from keel.entrypoints.openai.chat_completion.serving import OpenAIServingChat
from keel.entrypoints.openai.completion.api_router import router as completion_router
from keel.entrypoints.openai.completion.serving import OpenAIServingCompletion
from keel.entrypoints.openai.errors import APIError, install_handlers
from keel.entrypoints.openai.models.api_router import router as models_router
from keel.entrypoints.openai.serving_engine import OpenAIServing, ServingConfig
from keel.entrypoints.openai.stats import PROMETHEUS_CONTENT_TYPE, render_prometheus


@dataclass(slots=True)
class ServerLimits:
    """Admission and size limits of the HTTP layer."""

    max_body_bytes: int = 1 << 20
    max_tokens: int = 4096  # per request (max_tokens / max_completion_tokens)
    max_waiting: int = 256  # requests queued beyond the engine's running batch before 503

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"ServerLimits: {name} must be >= 1, got {getattr(self, name)}")
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

    def __init__(self, app: ASGIApp, api_key: str | None, max_body_bytes: int) -> None:
        self.app, self.api_key, self.max_body_bytes = app, api_key, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
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
    engine: AsyncEngine, *, model_name: str, api_key: str | None = None, limits: ServerLimits | None = None
) -> FastAPI:
    """The OpenAI-compatible app over a running `AsyncEngine` (whose `engine` is an `LLMEngine`)."""
    limits = limits or ServerLimits()
    llm = engine.engine
    cfg = ServingConfig(
        model_name=model_name,
        max_model_len=llm.config.max_position_embeddings,
        vocab_size=llm.config.vocab_size,
        max_tokens_limit=limits.max_tokens,
    )
    app = FastAPI(title="keel serve", summary="OpenAI-compatible API of keel", version="0.1.0")
    install_handlers(app)
    serving = OpenAIServing(engine, llm.tokenizer, cfg)
    app.state.engine, app.state.serving, app.state.started = engine, serving, int(time.time())
    app.state.completion, app.state.chat = OpenAIServingCompletion(serving), OpenAIServingChat(serving)
    for router in (completion_router, chat_router, models_router):
        app.include_router(router)

    @app.get("/health")
    async def health(raw: Request) -> JSONResponse:
        eng: AsyncEngine = raw.app.state.engine
        if not eng.alive:
            return APIError(503, f"the engine thread has stopped: {eng.error!r}").response()
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics(raw: Request) -> PlainTextResponse:
        eng: AsyncEngine = raw.app.state.engine
        text = render_prometheus(model_name, eng, raw.app.state.serving.stats)
        return PlainTextResponse(text, media_type=PROMETHEUS_CONTENT_TYPE)

    return Guard(app, api_key, limits.max_body_bytes)  # type: ignore[return-value]


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
