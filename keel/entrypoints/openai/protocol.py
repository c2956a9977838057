"""Pydantic models shared by the endpoints: the request base, sampling fields, usage, errors.

Requests mirror OpenAI's schema. Unknown fields are refused (400, as OpenAI does); fields keel
accepts but does not act on (`user`, `metadata`, ...) are listed; fields whose non-default values
keel cannot honour (`logprobs`, `tools`, penalties, ...) are accepted only at their defaults, so a
client never silently gets something other than what it asked for.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_N = 16  # choices per request
MAX_STOP = 16  # stop strings per request


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ResponseModel(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(OpenAIBaseModel):
    include_usage: bool | None = False
    include_obfuscation: bool | None = None  # accepted, ignored (keel adds no obfuscation padding)


def _is_default(value: Any) -> bool:
    return value in (None, False, 0, 0.0, [], {}, "none", "auto") or value == {"type": "text"}


class SamplingRequest(OpenAIBaseModel):
    """The sampling / stopping fields of both endpoints, with OpenAI's defaults and ranges."""

    model: str
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)
    max_tokens: int | None = Field(default=None, ge=1)
    # accepted and ignored: they change nothing about the output
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # not supported: only their defaults are accepted
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: Any = None
    # keel / vLLM extensions
    top_k: int | None = Field(default=None, ge=-1)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    ignore_eos: bool = False

    UNSUPPORTED: ClassVar[tuple[str, ...]] = ("frequency_penalty", "presence_penalty", "logit_bias", "logprobs")

    @model_validator(mode="after")
    def _check(self) -> SamplingRequest:
        for name in self.UNSUPPORTED:
            if not _is_default(getattr(self, name)):
                raise ValueError(f"{name} is not supported by keel serve (only its default is accepted)")
        stops = self.stop_list
        if len(stops) > MAX_STOP:
            raise ValueError(f"stop takes at most {MAX_STOP} strings, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class UsageInfo(ResponseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: dict[str, int] | None = None  # {"cached_tokens": n} from the prefix cache


class ErrorInfo(ResponseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(ResponseModel):
    error: ErrorInfo


class ModelCard(ResponseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "keel"
    max_model_len: int | None = None


class ModelList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
