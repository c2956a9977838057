"""`keel serve`: an OpenAI-compatible HTTP server (completions, chat completions, models, health, metrics).
Its flags are generated from `EngineConfig` (the engine) and `ServerConfig` (the server's own options)."""

from __future__ import annotations

import argparse
import sys

from keel.cli.flags import add_flags, from_flags
from keel.engine.config import EngineConfig
from keel.entrypoints.openai.server_config import ServerConfig

_EXPECTED_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, RuntimeError, ImportError)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve a Hugging Face checkpoint with an OpenAI-compatible API: POST /v1/completions, "
        "POST /v1/chat/completions, GET /v1/models, POST /tokenize, POST /detokenize, GET /version, GET /health, "
        "GET /metrics (Prometheus); /health, /version and /metrics answer without --api-key. "
        "SIGTERM / SIGINT drain: /health 503, new requests 503, running ones get "
        "--shutdown-timeout seconds.",
    )
    add_flags(p, EngineConfig, "engine")
    add_flags(p, ServerConfig, "server")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        from keel.entrypoints.openai.api_server import build_app, check_bind, make_async_engine

        server = from_flags(ServerConfig, args)
        check_bind(server.host, server.api_key)
        from keel.engine import LLMEngine

        config = from_flags(EngineConfig, args)
        # loaded on the engine thread, which then runs it (AsyncEngine.start says why)
        engine = make_async_engine(lambda: LLMEngine.from_config(config), server, config.max_num_seqs)
        llm = engine.engine
    except _EXPECTED_ERRORS as exc:
        msg = str(exc)
        print(msg if msg.startswith("keel serve") else f"keel serve: error: {msg}", file=sys.stderr)
        return 1
    from keel.entrypoints.openai.api_server import run_server

    name = server.served_model_name or config.model
    try:
        try:
            app = build_app(
                engine,
                model_name=name,
                api_key=server.api_key,
                limits=server,
                trust_request_chat_template=server.trust_request_chat_template,
                require_warm_up=True,
            )
        except ValueError as exc:
            print(str(exc), file=sys.stderr)
            return 1
        print(
            f"keel serve: {name} on http://{server.host}:{server.port}/v1 "
            f"({llm.config.architecture}, context {llm.config.max_position_embeddings})",
            file=sys.stderr,
        )
        return run_server(
            app,
            host=server.host,
            port=server.port,
            log_level=server.log_level,
            shutdown_timeout_s=server.shutdown_timeout_s,
        )
    finally:
        engine.shutdown()
