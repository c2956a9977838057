"""Typed errors of the engine's request API: each carries the field it is about, so callers (the HTTP
server's 400 `param`) read an attribute instead of parsing a message."""

from __future__ import annotations


class RequestValidationError(ValueError):
    """A request's parameter is out of range or malformed; `field` names it (dotted for nested fields,
    e.g. "structured_outputs.json"), and the message says what was expected."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class ConfigError(ValueError):
    """An engine's construction argument (`EngineConfig`, `LLM`, `LLMEngine`, `keel serve`'s flags) is out
    of range or malformed; `field` names it, and the message says what was expected."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
