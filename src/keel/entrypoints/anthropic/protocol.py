"""`POST /v1/messages` and `/v1/messages/count_tokens`: requests and the message object, as in Anthropic's
Messages API.

Requests mirror Anthropic's schema for a text model with client tools: `system`, `messages` of text, `tool_use` and
`tool_result` blocks (thinking blocks passed back are accepted and not rendered), custom `tools`, `tool_choice`,
`max_tokens`, `stop_sequences`, `temperature` / `top_p` / `top_k`, `output_config.format` (a JSON schema through
the structured-output engine), `stream`. Unknown fields are refused; fields keel accepts but cannot act on are
ignored (docs/serving.md lists them); images, documents and server tools are a 400 naming the block or tool.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from keel.entrypoints.openai.chat_utils import MAX_JSON_DEPTH, json_depth
from keel.entrypoints.openai.errors import bad_request
from keel.entrypoints.openai.protocol import OpenAIBaseModel, ResponseModel

MAX_MESSAGES = 2048
TOOL_NAME = r"^[A-Za-z0-9_\-]{1,128}$"


class TextBlock(OpenAIBaseModel):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None  # accepted, ignored: keel's prefix cache is automatic
    citations: list[Any] | None = None


class ToolUseBlock(OpenAIBaseModel):
    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=128)
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None
    caller: dict[str, Any] | None = None


class ToolResultBlock(OpenAIBaseModel):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=256)
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = None

    def text(self) -> str:
        body = self.content if isinstance(self.content, str) else "".join(b.text for b in self.content or [])
        return f"Error: {body}" if self.is_error else body


class ThinkingBlock(OpenAIBaseModel):
    """A thinking block passed back: accepted and not rendered (keel's models write none)."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(OpenAIBaseModel):
    type: Literal["redacted_thinking"]
    data: str


Block = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock, Field(discriminator="type")
]
BLOCK_TYPES = ("text", "tool_use", "tool_result", "thinking", "redacted_thinking")


class MessageParam(OpenAIBaseModel):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class CustomTool(OpenAIBaseModel):
    type: Literal["custom"] | None = None
    name: str = Field(pattern=TOOL_NAME)
    description: str | None = None
    input_schema: dict[str, Any]
    cache_control: dict[str, Any] | None = None  # accepted, ignored
    strict: bool | None = None


class ToolChoice(OpenAIBaseModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class JsonOutputFormat(OpenAIBaseModel):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(OpenAIBaseModel):
    format: JsonOutputFormat | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None  # accepted, ignored (no thinking)


class Metadata(OpenAIBaseModel):
    user_id: str | None = None


class ThinkingConfig(OpenAIBaseModel):
    """Accepted and ignored: keel's models write no thinking blocks, so a budget for them changes nothing."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None
    display: str | None = None


class _Conversation(OpenAIBaseModel):
    """What /v1/messages and /v1/messages/count_tokens both take."""

    model: str
    messages: list[MessageParam] = Field(min_length=1, max_length=MAX_MESSAGES)
    system: str | list[TextBlock] | None = None
    tools: list[CustomTool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _kinds(cls, data: Any) -> Any:
        """Blocks and tools keel cannot serve: a 400 naming the one found."""
        if not isinstance(data, dict):
            return data
        messages = data.get("messages")
        for i, m in enumerate(messages if isinstance(messages, list) else []):
            content = m.get("content") if isinstance(m, dict) else None
            for k, block in enumerate(content if isinstance(content, list) else []):
                kind = block.get("type") if isinstance(block, dict) else None
                if kind not in BLOCK_TYPES:
                    raise bad_request(
                        f"messages.{i}.content.{k}.type: {kind!r} blocks are not supported by keel serve (it takes "
                        f"{', '.join(BLOCK_TYPES)}: text and client tools)",
                        f"messages.{i}.content.{k}.type",
                    )
                depth = json_depth(block.get("input")) if kind == "tool_use" else 0
                if depth > MAX_JSON_DEPTH:
                    where = f"messages.{i}.content.{k}.input"
                    raise bad_request(
                        f"{where} nests {depth} levels of arrays / objects; at most {MAX_JSON_DEPTH}", where
                    )
        tools = data.get("tools")
        for i, tool in enumerate(tools if isinstance(tools, list) else []):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind not in (None, "custom"):
                raise bad_request(
                    f"tools.{i}.type: {kind!r} is a server tool, which keel serve does not run (it takes client tools: "
                    "name, description, input_schema)",
                    f"tools.{i}.type",
                )
        return data

    @model_validator(mode="after")
    def _check_tools(self) -> _Conversation:
        names = [t.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise ValueError("tools: tool names must be unique")
        choice = self.tool_choice
        if choice is not None and choice.type == "tool":
            if choice.name is None:
                raise ValueError('tool_choice: type "tool" needs a name')
            if choice.name not in names:
                raise ValueError(f"tool_choice names {choice.name!r}, which is not in tools {names}")
        elif choice is not None and choice.name is not None:
            raise ValueError(f'tool_choice.name is only allowed with type "tool", not {choice.type!r}')
        if choice is not None and choice.type in ("any", "tool") and not names:
            raise ValueError("tool_choice needs tools")
        return self

    def conversation(self) -> list[dict[str, Any]]:
        """Messages as chat templates read them: the system prompt first, tool_use blocks as the assistant's tool
        calls, tool_result blocks as tool messages (before the rest of their user turn)."""
        out: list[dict[str, Any]] = []
        system = self.system if isinstance(self.system, str) else "".join(b.text for b in self.system or [])
        if system:
            out.append({"role": "system", "content": system})
        for m in self.messages:
            if isinstance(m.content, str):
                out.append({"role": m.role, "content": m.content})
                continue
            text = "".join(b.text for b in m.content if isinstance(b, TextBlock))
            calls = [
                {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input)}}
                for b in m.content
                if isinstance(b, ToolUseBlock)
            ]
            results = [b for b in m.content if isinstance(b, ToolResultBlock)]
            out += [{"role": "tool", "tool_call_id": b.tool_use_id, "content": b.text()} for b in results]
            if calls:
                out.append({"role": m.role, "content": text, "tool_calls": calls})
            elif text or not results:
                out.append({"role": m.role, "content": text})
        return out

    def tool_specs(self) -> list[dict[str, Any]]:
        """The tools as chat templates read them ({"type": "function", "function": {...}})."""
        out = []
        for t in self.tools or []:
            fn = {"name": t.name, "description": t.description, "parameters": t.input_schema}
            out.append({"type": "function", "function": {k: v for k, v in fn.items() if v is not None}})
        return out

    @property
    def choice(self) -> tuple[str | None, str | None]:
        """(none | auto | required | named | None, the named tool): Anthropic's any is OpenAI's required."""
        c = self.tool_choice
        if c is None:
            return None, None
        return {"auto": "auto", "any": "required", "none": "none", "tool": "named"}[c.type], c.name

    @property
    def parallel(self) -> bool:
        return not (self.tool_choice is not None and self.tool_choice.disable_parallel_tool_use)


class MessagesRequest(_Conversation):
    """`POST /v1/messages`."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = Field(default=None, max_length=16)
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    stream: bool = False
    output_config: OutputConfig | None = None
    # accepted and ignored: they change nothing about the output
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    cache_control: dict[str, Any] | None = None
    inference_geo: str | None = None

    @model_validator(mode="after")
    def _check_stops(self) -> MessagesRequest:
        if any(not s for s in self.stop_sequences or []):
            raise ValueError("stop_sequences must be non-empty strings")
        return self

    def constraints(self) -> list[tuple[str, dict[str, Any]]]:
        fmt = self.output_config.format if self.output_config is not None else None
        return [("output_config.format", {"json": fmt.schema_})] if fmt is not None else []


class CountTokensRequest(_Conversation):
    """`POST /v1/messages/count_tokens`."""


# ---- what the server answers ------------------------------------------------------------------------------------


class Usage(ResponseModel):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class MessageObject(ResponseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[dict[str, Any]]  # text and tool_use blocks
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None = None
    stop_sequence: str | None = None
    usage: Usage


class TokenCount(ResponseModel):
    input_tokens: int


class AnthropicErrorInfo(ResponseModel):
    type: str
    message: str


class AnthropicError(ResponseModel):
    """Anthropic's error body."""

    type: Literal["error"] = "error"
    error: AnthropicErrorInfo
