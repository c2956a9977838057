"""`POST /v1/chat/completions`: request, response and stream chunk, as in OpenAI's chat completions API."""

from __future__ import annotations

import time
from typing import Any, ClassVar, Literal

from pydantic import Field, model_serializer, model_validator

from keel.entrypoints.openai.protocol import OpenAIBaseModel, ResponseModel, SamplingRequest, UsageInfo


class TextPart(OpenAIBaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(OpenAIBaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: Any = None
    refusal: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: Any = None
    prediction: Any = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    web_search_options: Any = None

    UNSUPPORTED: ClassVar[tuple[str, ...]] = SamplingRequest.UNSUPPORTED + (
        "top_logprobs",
        "tools",
        "tool_choice",
        "functions",
        "function_call",
        "response_format",
        "audio",
        "prediction",
        "reasoning_effort",
        "web_search_options",
    )

    @model_validator(mode="after")
    def _check_chat(self) -> ChatCompletionRequest:
        if self.modalities not in (None, ["text"]):
            raise ValueError("modalities: keel serve produces text only")
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            if self.max_tokens != self.max_completion_tokens:
                raise ValueError("max_tokens and max_completion_tokens disagree; give one of them")
        return self

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def conversation(self) -> list[dict[str, str]]:
        """Messages as the chat template takes them (`developer` is OpenAI's new name for `system`)."""
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]


class ChatCompletionMessage(ResponseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None


class ChatCompletionChoice(ResponseModel):
    index: int
    message: ChatCompletionMessage
    logprobs: Any = None
    finish_reason: Literal["stop", "length"] | None = None


class ChatCompletionResponse(ResponseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None


class DeltaMessage(ResponseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: Any) -> dict[str, Any]:
        # OpenAI sends only the fields a delta carries: `{}` in a choice's last chunk
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatCompletionStreamChoice(ResponseModel):
    index: int
    delta: DeltaMessage
    logprobs: Any = None
    finish_reason: Literal["stop", "length"] | None = None


class ChatCompletionStreamResponse(ResponseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionStreamChoice]
    usage: UsageInfo | None = None
