"""`POST /v1/completions`: request, response and stream chunk, as in OpenAI's legacy completions API."""

from __future__ import annotations

import time
from typing import Any, ClassVar, Literal, cast

from pydantic import Field, model_validator

from keel.entrypoints.openai.protocol import MAX_LOGPROBS, ResponseModel, SamplingRequest, UsageInfo

MAX_PROMPTS = 64  # prompts in one request


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool | None = False
    suffix: str | None = None
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    add_special_tokens: bool = True
    prompt_embeds: Any = None

    REFUSED: ClassVar[dict[str, str]] = {
        **SamplingRequest.REFUSED,
        "suffix": "keel has no fill-in-the-middle (insert) mode",
        "prompt_embeds": "keel takes token or text prompts only",
    }

    @model_validator(mode="after")
    def _check_prompt(self) -> CompletionRequest:
        prompts = self.prompts
        if not prompts:
            raise ValueError("prompt must not be empty")
        if len(prompts) > MAX_PROMPTS:
            raise ValueError(f"at most {MAX_PROMPTS} prompts per request, got {len(prompts)}")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("prompt must not be empty (no empty string or token list)")
        if self.max_tokens == 0 and not self.echo and self.prompt_logprobs is None:
            raise ValueError("max_tokens: 0 is only allowed with echo: true or prompt_logprobs (a scoring request)")
        return self

    @property
    def prompts(self) -> list[str] | list[list[int]]:
        """The prompt(s) as a list: strings or token-id lists."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and isinstance(p[0], int):
            return [cast(list[int], p)]
        return cast("list[str] | list[list[int]]", list(p))


class CompletionChoice(ResponseModel):
    index: int
    text: str
    logprobs: Any = None
    finish_reason: Literal["stop", "length"] | None = None
    prompt_logprobs: Any = None  # vLLM: per prompt token null or {id: {logprob, rank, decoded_token}}


class CompletionResponse(ResponseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None


class CompletionStreamResponse(ResponseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
