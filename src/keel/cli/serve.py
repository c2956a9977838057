"""`keel serve`: an OpenAI-compatible HTTP server (completions, chat completions, models, health, metrics)."""

from __future__ import annotations

import argparse
import os
import sys

from keel.engine.config import DEFAULTS

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
    p.add_argument("--model", default=None, help="Hugging Face repo id or local folder (default: keel's demo model)")
    p.add_argument("--revision", default=None, help="hub revision (branch, tag or commit)")
    p.add_argument("--served-model-name", default=None, help="the name clients pass as `model` (default: --model)")
    p.add_argument(
        "--dtype",
        default="auto",
        help="auto: bf16 where supported, else fp32",
        choices=("auto", "bf16", "bfloat16", "fp32", "float32", "fp16", "float16"),
    )
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument(
        "--quantization",
        default=None,
        choices=("none", "fp8"),
        help="fp8: block-scaled FP8 weights for the linear layers (the engine's fp8 path; CUDA)",
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="prompt + completion tokens per request (default: the model's context; at most that)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; others need --api-key)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--api-key",
        default=os.environ.get("KEEL_API_KEY"),
        help="require `Authorization: Bearer KEY` on every route but /health, /version and /metrics (default: "
        "$KEEL_API_KEY); printable ASCII without surrounding whitespace",
    )
    p.add_argument("--block-size", type=int, default=DEFAULTS.block_size, help="tokens per KV cache block")
    p.add_argument("--max-num-seqs", type=int, default=DEFAULTS.max_num_seqs, help="requests decoded together at most")
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=DEFAULTS.max_num_batched_tokens,
        help="tokens one engine step computes at most: decodes first, then prompts, a longer one in chunks "
        f"over several steps (default {DEFAULTS.max_num_batched_tokens}; at least --max-num-seqs)",
    )
    p.add_argument(
        "--max-waiting",
        type=int,
        default=256,
        help="requests queued beyond the running batch; more are refused with 503",
    )
    p.add_argument(
        "--kv-cache-gib", type=float, default=DEFAULTS.max_kv_cache_bytes / (1 << 30), help="KV cache budget in GiB"
    )
    p.add_argument(
        "--no-prefix-caching",
        dest="prefix_caching",
        action="store_false",
        default=DEFAULTS.enable_prefix_caching,
        help="do not share KV blocks between requests",
    )
    p.add_argument("--max-tokens-limit", type=int, default=4096, help="largest max_tokens a request may ask for")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request body accepted")
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="on SIGTERM / SIGINT: seconds running requests get to finish (default 30); streams still open "
        "then end with an error chunk and [DONE]",
    )
    # --- what a request or a client may hold (issue 26): templates, grammars, timeouts, connections ---
    p.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="render a request's own `chat_template` (vLLM's flag); without it such a request gets 400. Every "
        "template runs in a worker process with a time, memory and output limit",
    )
    p.add_argument("--chat-template-timeout", type=float, default=5.0, help="seconds one template render may take")
    p.add_argument(
        "--grammar-timeout", type=float, default=10.0, help="seconds a request waits for its grammar to compile"
    )
    p.add_argument(
        "--send-timeout",
        type=float,
        default=30.0,
        help="a client that takes no response data for this many seconds (it stopped reading) has its "
        "requests aborted and its connection closed (default 30)",
    )
    p.add_argument("--header-timeout", type=float, default=10.0, help="seconds to send complete request headers")
    p.add_argument("--body-timeout", type=float, default=30.0, help="seconds to send the whole request body")
    p.add_argument("--keep-alive-timeout", type=float, default=5.0, help="idle keep-alive connections close after")
    p.add_argument("--max-connections", type=int, default=1024, help="open connections at most; more get 503")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        from keel.entrypoints.openai.api_server import ServerLimits, build_app, check_bind, make_async_engine

        check_bind(args.host, args.api_key)
        if not 0 <= args.port < 65536:
            raise ValueError(f"keel serve: --port must be in [0, 65535], got {args.port}")
        if args.shutdown_timeout < 0:
            raise ValueError(f"keel serve: --shutdown-timeout must be >= 0, got {args.shutdown_timeout}")
        limits = ServerLimits(
            max_body_bytes=args.max_body_bytes,
            max_tokens=args.max_tokens_limit,
            max_waiting=args.max_waiting,
            max_model_len=args.max_model_len,
            send_timeout_s=args.send_timeout,
            header_timeout_s=args.header_timeout,
            body_timeout_s=args.body_timeout,
            keep_alive_s=args.keep_alive_timeout,
            max_connections=args.max_connections,
            template_timeout_s=args.chat_template_timeout,
            grammar_timeout_s=args.grammar_timeout,
        )
        from keel.engine import EngineConfig, LLMEngine

        model = args.model or DEFAULTS.model
        config = EngineConfig(
            model=model,
            dtype=args.dtype,
            device=args.device,
            revision=args.revision,
            block_size=args.block_size,
            max_num_seqs=args.max_num_seqs,
            max_kv_cache_bytes=int(args.kv_cache_gib * (1 << 30)),
            max_num_batched_tokens=args.max_num_batched_tokens,
            enable_prefix_caching=args.prefix_caching,
            quantization=args.quantization,
        )
        # loaded on the engine thread, which then runs it (AsyncEngine.start says why)
        engine = make_async_engine(lambda: LLMEngine.from_config(config), limits, args.max_num_seqs)
        llm = engine.engine
    except _EXPECTED_ERRORS as exc:
        msg = str(exc)
        print(msg if msg.startswith("keel serve") else f"keel serve: error: {msg}", file=sys.stderr)
        return 1
    from keel.entrypoints.openai.api_server import run_server

    name = args.served_model_name or model
    try:
        try:
            app = build_app(
                engine,
                model_name=name,
                api_key=args.api_key,
                limits=limits,
                trust_request_chat_template=args.trust_request_chat_template,
                require_warm_up=True,
            )
        except ValueError as exc:
            print(str(exc), file=sys.stderr)
            return 1
        print(
            f"keel serve: {name} on http://{args.host}:{args.port}/v1 "
            f"({llm.config.architecture}, context {llm.config.max_position_embeddings})",
            file=sys.stderr,
        )
        return run_server(
            app, host=args.host, port=args.port, log_level=args.log_level, shutdown_timeout_s=args.shutdown_timeout
        )
    finally:
        engine.shutdown()
