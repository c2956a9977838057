"""`POST /v1/chat/completions`: request, response and stream chunk, as in OpenAI's chat completions API."""

from __future__ import annotations

import time
from typing import Any, ClassVar, Literal

from pydantic import Field, model_serializer, model_validator

from keel.entrypoints.openai.protocol import MAX_LOGPROBS, OpenAIBaseModel, ResponseModel, SamplingRequest, UsageInfo


class TextPart(OpenAIBaseModel):
    type: Literal["text"]
    text: str


class FunctionCall(OpenAIBaseModel):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(OpenAIBaseModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(OpenAIBaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    refusal: str | None = None
    reasoning_content: str | None = None  # vLLM: accepted on assistant messages, not rendered

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def for_template(self) -> dict[str, Any]:
        m: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.name is not None:
            m["name"] = self.name
        if self.tool_call_id is not None:
            m["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            m["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        return m


class FunctionDef(OpenAIBaseModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(OpenAIBaseModel):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(OpenAIBaseModel):
    name: str


class NamedToolChoice(OpenAIBaseModel):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = True
    # vLLM's chat extensions
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # refused at non-default values (REFUSED says why)
    functions: list[Any] | None = None
    function_call: Any = None
    modalities: list[str] | None = None
    audio: Any = None
    prediction: Any = None
    reasoning_effort: str | None = None
    include_reasoning: bool = True
    verbosity: str | None = None
    web_search_options: Any = None
    mm_processor_kwargs: dict[str, Any] | None = None

    REFUSED: ClassVar[dict[str, str]] = {
        **SamplingRequest.REFUSED,
        "functions": "deprecated by OpenAI; send tools",
        "function_call": "deprecated by OpenAI; send tool_choice",
        "audio": "keel serve produces text only",
        "prediction": "keel has no predicted-output (speculative) mode",
        "reasoning_effort": "keel has no reasoning-effort control",
        "web_search_options": "keel has no web search",
        "mm_processor_kwargs": "keel serves text-only models",
    }

    @model_validator(mode="after")
    def _check_chat(self) -> ChatCompletionRequest:
        if self.modalities not in (None, ["text"]):
            raise ValueError("modalities: keel serve produces text only")
        if self.verbosity not in (None, "medium"):
            raise ValueError("verbosity: keel has no verbosity control (only medium, the default, is accepted)")
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            if self.max_tokens != self.max_completion_tokens:
                raise ValueError("max_tokens and max_completion_tokens disagree; give one of them")
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        if self.tool_choice is not None and self.tool_choice != "none" and not self.tools:
            raise ValueError("tool_choice needs tools")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tools:
            names = [t.function.name for t in self.tools]
            if self.tool_choice.function.name not in names:
                raise ValueError(f"tool_choice names {self.tool_choice.function.name!r}, which is not in tools {names}")
        if self.tools and len({t.function.name for t in self.tools}) != len(self.tools):
            raise ValueError("tools: function names must be unique")
        return self

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def tool_mode(self) -> str:
        """none | auto | required | named (OpenAI: auto when tools are given and tool_choice is not)."""
        if not self.tools:
            return "none"
        if isinstance(self.tool_choice, NamedToolChoice):
            return "named"
        return self.tool_choice or "auto"

    def tool_specs(self) -> list[dict[str, Any]]:
        """The tools as templates read them ({"type": "function", "function": {...}})."""
        return [t.model_dump(exclude_none=True) for t in self.tools or []]

    def conversation(self) -> list[dict[str, Any]]:
        """Messages as the chat template takes them (`developer` is OpenAI's new name for `system`)."""
        return [m.for_template() for m in self.messages]


class ChatCompletionMessage(ResponseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)


class ChatCompletionChoice(ResponseModel):
    index: int
    message: ChatCompletionMessage
    logprobs: Any = None
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None


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
    tool_calls: list[dict[str, Any]] | None = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: Any) -> dict[str, Any]:
        # OpenAI sends only the fields a delta carries: `{}` in a choice's last chunk
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatCompletionStreamChoice(ResponseModel):
    index: int
    delta: DeltaMessage
    logprobs: Any = None
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None


class ChatCompletionStreamResponse(ResponseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionStreamChoice]
    usage: UsageInfo | None = None
