"""`ServerConfig`: the one place `keel serve`'s own options (where it listens, who may call it, what a
request and a client may hold, how it drains) and their defaults are written; its flags are generated
from these fields (`keel.cli.flags`), and `build_app` / `uvicorn_config` read the limits from it. It
validates itself on construction (a ValueError naming the field); the bind check, which needs the API
key and the host together with the server's rules, is `api_server.check_bind`."""

from __future__ import annotations

from dataclasses import dataclass, fields

from keel.engine.config import flag_name, setting
from keel.entrypoints.openai.tool_parsers import PARSER_CHOICES

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


@dataclass(slots=True)
class ServerConfig:
    """Where `keel serve` listens and the limits of its HTTP layer."""

    host: str = setting("127.0.0.1", "address to bind (others than loopback need --api-key)")
    port: int = setting(8000, "port to bind")
    api_key: str | None = setting(
        None,
        "require `Authorization: Bearer KEY` on every route but /health, /version and /metrics (default: "
        "$KEEL_API_KEY); printable ASCII without surrounding whitespace",
        env="KEEL_API_KEY",
    )
    served_model_name: str | None = setting(None, "the name clients pass as `model` (default: --model)")
    max_body_bytes: int = setting(1 << 20, "largest request body accepted")
    max_tokens: int = setting(4096, "largest max_tokens a request may ask for", flag="--max-tokens-limit")
    max_waiting: int = setting(256, "requests queued beyond the running batch; more are refused with 503")
    max_model_len: int | None = setting(
        None, "prompt + completion tokens per request (default: the model's context; at most that)"
    )
    send_timeout_s: float = setting(
        30.0,
        "a client that takes no response data for this many seconds (it stopped reading) has its requests "
        "aborted and its connection closed",
    )
    header_timeout_s: float = setting(10.0, "seconds to send complete request headers")
    body_timeout_s: float = setting(30.0, "seconds to send the whole request body")
    keep_alive_s: float = setting(5.0, "idle keep-alive connections close after", flag="--keep-alive-timeout")
    max_connections: int = setting(1024, "open connections at most; more get 503")
    max_header_bytes: int = setting(64 * 1024, "largest request line and headers")
    trust_request_chat_template: bool = setting(
        False,
        "render a request's own `chat_template` (vLLM's flag); without it such a request gets 400. Every "
        "template runs in a worker process with a time, memory and output limit",
    )
    template_timeout_s: float = setting(
        5.0, "seconds one chat template render may take (its worker is killed past it)", flag="--chat-template-timeout"
    )
    template_workers: int = setting(2, "worker processes that render chat templates")
    template_memory_mib: int = setting(512, "MiB of address space a chat template worker may use above its start")
    grammar_timeout_s: float = setting(
        10.0, "seconds a request waits for its grammar to compile (its compile worker is killed then)"
    )
    grammar_workers: int = setting(2, "worker processes that compile grammars, regexes and JSON schemas")
    grammar_memory_mib: int = setting(512, "MiB of address space a grammar compile worker may use above its start")
    tool_call_parser: str = setting(
        "auto",
        "how tool calls are read from the text of a tool_choice auto request: the model family's format (vLLM's "
        "names); auto: the one the chat template shows",
        choices=PARSER_CHOICES,
    )
    response_store_mib: int = setting(
        64,
        "MiB of responses kept in memory for store: true (GET / DELETE / cancel by id, previous_response_id); 0: none",
    )
    response_store_ttl_s: float = setting(3600.0, "seconds a stored response is kept")
    tokenizer_threads: int = setting(1, "threads that tokenize prompts (off the event loop and the engine thread)")
    shutdown_timeout_s: float = setting(
        30.0,
        "on SIGTERM / SIGINT: seconds running requests get to finish; streams still open then end with an "
        "error chunk and [DONE]",
    )
    log_level: str = setting("info", "uvicorn's log level", choices=LOG_LEVELS)

    def __post_init__(self) -> None:
        for name in (
            "max_body_bytes",
            "max_tokens",
            "max_connections",
            "max_header_bytes",
            "template_workers",
            "grammar_workers",
            "tokenizer_threads",
        ):
            self._check(name, getattr(self, name) >= 1, ">= 1")
        for name in ("template_memory_mib", "grammar_memory_mib"):
            self._check(name, getattr(self, name) >= 64, ">= 64")
        for name in ("send", "header", "body", "template", "grammar"):
            self._check(f"{name}_timeout_s", getattr(self, f"{name}_timeout_s") > 0, "> 0")
        self._check("keep_alive_s", self.keep_alive_s > 0, "> 0")
        self._check("max_model_len", self.max_model_len is None or self.max_model_len >= 2, ">= 2 or None")
        self._check("max_waiting", self.max_waiting >= 0, ">= 0")
        self._check("response_store_mib", self.response_store_mib >= 0, ">= 0")
        self._check("response_store_ttl_s", self.response_store_ttl_s > 0, "> 0")
        self._check("tool_call_parser", self.tool_call_parser in PARSER_CHOICES, f"one of {', '.join(PARSER_CHOICES)}")
        self._check("port", 0 <= self.port < 65536, "in [0, 65535]")
        self._check("shutdown_timeout_s", self.shutdown_timeout_s >= 0, ">= 0")
        self._check("log_level", self.log_level in LOG_LEVELS, f"one of {', '.join(LOG_LEVELS)}")

    def _check(self, name: str, ok: bool, expected: str) -> None:
        if not ok:
            flag = flag_name(next(f for f in fields(self) if f.name == name))
            raise ValueError(f"{flag} must be {expected} (ServerConfig.{name}), got {getattr(self, name)!r}")
