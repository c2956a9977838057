"""`POST /v1/responses`: the request, the response object and its output items, as in OpenAI's Responses API.

The request mirrors OpenAI's schema for what a text model with function tools can do: `input` as a string or a
list of items (messages, `function_call`, `function_call_output`, reasoning items passed back, references to stored
items), `instructions`, function `tools`, `tool_choice`, `text.format` (JSON schema through the structured-output
engine), the sampling fields, `store` / `previous_response_id`. Unknown fields are refused; fields keel accepts but
cannot act on are accepted and ignored (docs/serving.md lists them); fields it cannot honour are accepted only at
their defaults (`REFUSED` says why). Items and tools of kinds keel cannot serve (images, files, hosted tools) are a
400 naming the item.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from keel.entrypoints.openai.chat_utils import MAX_JSON_DEPTH, json_depth
from keel.entrypoints.openai.errors import bad_request
from keel.entrypoints.openai.protocol import OpenAIBaseModel, ResponseModel

MAX_ITEMS = 2048  # input items in one request
MAX_METADATA = 16  # metadata keys (OpenAI's limit)
FUNCTION_NAME = r"^[A-Za-z0-9_.\-]+$"
_STATUS = Literal["in_progress", "completed", "incomplete"]


class InputText(OpenAIBaseModel):
    type: Literal["input_text"]
    text: str


class OutputText(OpenAIBaseModel):
    type: Literal["output_text"]
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] | None = None


class RefusalPart(OpenAIBaseModel):
    type: Literal["refusal"]
    refusal: str


TextPart = Annotated[InputText | OutputText | RefusalPart, Field(discriminator="type")]
TEXT_PARTS = ("input_text", "output_text", "refusal")


def part_text(content: str | list[Any]) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.refusal if isinstance(p, RefusalPart) else p.text for p in content)


class InputMessage(OpenAIBaseModel):
    """A message item (`type` may be left out, as OpenAI's easy input messages do)."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[TextPart]
    id: str | None = None
    status: _STATUS | None = None
    phase: Literal["commentary", "final_answer"] | None = None


class FunctionCallInput(OpenAIBaseModel):
    """A call the model made, passed back."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=64)
    arguments: str
    id: str | None = None
    status: _STATUS | None = None


class FunctionCallOutputInput(OpenAIBaseModel):
    """What a function returned, for the call `call_id`."""

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=256)
    output: str | list[TextPart]
    id: str | None = None
    status: _STATUS | None = None


class ReasoningInput(OpenAIBaseModel):
    """A reasoning item passed back: accepted and not rendered (keel's models produce none)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[dict[str, Any]] = Field(default_factory=list)
    content: list[dict[str, Any]] | None = None
    encrypted_content: str | None = None
    status: _STATUS | None = None


class ItemReference(OpenAIBaseModel):
    """An item of a stored response, by id."""

    type: Literal["item_reference"]
    id: str = Field(min_length=1, max_length=256)


ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning", "item_reference")


def _item_type(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("type", "message"))
    return str(getattr(value, "type", "message"))


InputItem = Annotated[
    Annotated[InputMessage, Tag("message")]
    | Annotated[FunctionCallInput, Tag("function_call")]
    | Annotated[FunctionCallOutputInput, Tag("function_call_output")]
    | Annotated[ReasoningInput, Tag("reasoning")]
    | Annotated[ItemReference, Tag("item_reference")],
    Discriminator(_item_type),
]


class FunctionTool(OpenAIBaseModel):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionChoice(OpenAIBaseModel):
    type: Literal["function"]
    name: str


class FormatText(OpenAIBaseModel):
    type: Literal["text"]


class FormatJsonSchema(OpenAIBaseModel):
    type: Literal["json_schema"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


class FormatJsonObject(OpenAIBaseModel):
    type: Literal["json_object"]


class TextConfig(OpenAIBaseModel):
    format: Annotated[FormatText | FormatJsonSchema | FormatJsonObject, Field(discriminator="type")] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(OpenAIBaseModel):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class ResponsesStreamOptions(OpenAIBaseModel):
    include_obfuscation: bool | None = None  # accepted, ignored (keel adds no obfuscation padding)


# fields keel refuses at non-default values, with the reason given to the client
REFUSED: dict[str, str] = {
    "background": "keel runs no background responses",
    "conversation": "keel keeps no conversations; chain responses with previous_response_id",
    "prompt": "keel has no stored prompts",
    "context_management": "keel does not compact conversations",
    "top_logprobs": "keel returns no logprobs on /v1/responses (use /v1/chat/completions)",
}
KNOWN_TOOLS = ("web_search", "file_search", "computer", "code_interpreter", "image_generation", "mcp", "shell")


class ResponsesRequest(OpenAIBaseModel):
    """`POST /v1/responses`."""

    model: str | None = None  # None: the served model
    input: str | list[InputItem]
    instructions: str | None = None
    previous_response_id: str | None = Field(default=None, min_length=1, max_length=256)
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    store: bool | None = None
    stream: bool = False
    stream_options: ResponsesStreamOptions | None = None
    metadata: dict[str, str] | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    reasoning: ReasoningConfig | None = None
    # accepted and ignored: they change nothing about the output
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    service_tier: str | None = None
    max_tool_calls: int | None = Field(default=None, ge=1)  # a bound on hosted-tool calls; keel has none
    # vLLM's sampling extensions
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)
    # refused at non-default values (REFUSED says why)
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    context_management: list[Any] | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    REFUSED: ClassVar[dict[str, str]] = REFUSED

    @model_validator(mode="before")
    @classmethod
    def _kinds(cls, data: Any) -> Any:
        """Items, parts and tools of kinds keel cannot serve: a 400 naming the one found (before pydantic's
        union errors, which would list every kind it expected)."""
        if not isinstance(data, dict):
            return data
        items = data.get("input")
        for i, item in enumerate(items if isinstance(items, list) else []):
            if not isinstance(item, dict):
                continue
            kind = item.get("type", "message")
            if kind not in ITEM_TYPES:
                raise bad_request(
                    f"input.{i}.type: {kind!r} items are not supported by keel serve (it takes "
                    f"{', '.join(ITEM_TYPES)}: text and function tools)",
                    f"input.{i}.type",
                )
            args = item.get("arguments") if kind == "function_call" else None
            depth = json_depth(args) if isinstance(args, str) else 0
            if depth > MAX_JSON_DEPTH:
                where = f"input.{i}.arguments"
                raise bad_request(f"{where} nests {depth} levels of arrays / objects; at most {MAX_JSON_DEPTH}", where)
            for key in ("content", "output"):
                parts = item.get(key)
                for k, part in enumerate(parts if isinstance(parts, list) else []):
                    ptype = part.get("type") if isinstance(part, dict) else None
                    if ptype not in TEXT_PARTS:
                        raise bad_request(
                            f"input.{i}.{key}.{k}.type: {ptype!r} content is not supported: keel serve takes text "
                            f"({', '.join(TEXT_PARTS)})",
                            f"input.{i}.{key}.{k}.type",
                        )
        tools = data.get("tools")
        for i, tool in enumerate(tools if isinstance(tools, list) else []):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind != "function":
                hosted = isinstance(kind, str) and kind.startswith(KNOWN_TOOLS)
                raise bad_request(
                    f"tools.{i}.type: {kind!r} tools are not supported by keel serve: it runs function tools only"
                    + (" (hosted tools run on OpenAI's servers)" if hosted else ""),
                    f"tools.{i}.type",
                )
        choice = data.get("tool_choice")
        if isinstance(choice, dict) and choice.get("type") != "function":
            raise bad_request(
                f"tool_choice.type: {choice.get('type')!r} is not supported: keel serve takes none, auto, required "
                'or {"type": "function", "name": ...}',
                "tool_choice",
            )
        return data

    @model_validator(mode="after")
    def _check(self) -> ResponsesRequest:
        for name, reason in self.REFUSED.items():
            if getattr(self, name) not in (None, False, 0, [], {}):
                raise ValueError(f"{name} is not supported by keel serve: {reason} (only its default is accepted)")
        if isinstance(self.input, list) and not self.input and self.previous_response_id is None:
            raise ValueError("input must not be empty")
        if isinstance(self.input, list) and len(self.input) > MAX_ITEMS:
            raise ValueError(f"input takes at most {MAX_ITEMS} items, got {len(self.input)}")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        if self.truncation == "auto":
            raise ValueError(
                "truncation: keel does not drop input items to fit the context (a request that does not fit gets "
                "a 400); only disabled is accepted"
            )
        if self.reasoning is not None and self.reasoning.effort not in (None, "none"):
            raise ValueError("reasoning.effort: keel has no reasoning-effort control (only none is accepted)")
        if self.text is not None and self.text.verbosity not in (None, "medium"):
            raise ValueError("text.verbosity: keel has no verbosity control (only medium, the default, is accepted)")
        if "message.output_text.logprobs" in (self.include or []):
            raise ValueError("include: keel returns no logprobs on /v1/responses (use /v1/chat/completions)")
        if self.tool_choice not in (None, "none") and not self.tools:
            raise ValueError("tool_choice needs tools")
        names = [t.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise ValueError("tools: function names must be unique")
        if isinstance(self.tool_choice, FunctionChoice) and self.tool_choice.name not in names:
            raise ValueError(f"tool_choice names {self.tool_choice.name!r}, which is not in tools {names}")
        return self

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None:
            if len(value) > MAX_METADATA:
                raise ValueError(f"at most {MAX_METADATA} keys, got {len(value)}")
            for key, item in value.items():
                if len(key) > 64 or len(item) > 512:
                    raise ValueError("keys are at most 64 characters and values at most 512")
        return value

    def items(self) -> list[Any]:
        """The input as items (a string is one user message)."""
        if isinstance(self.input, str):
            return [InputMessage(role="user", content=self.input)]
        return list(self.input)

    def tool_specs(self) -> list[dict[str, Any]]:
        """The tools as chat templates read them ({"type": "function", "function": {...}})."""
        out = []
        for t in self.tools or []:
            fn = {"name": t.name, "description": t.description, "parameters": t.parameters}
            out.append({"type": "function", "function": {k: v for k, v in fn.items() if v is not None}})
        return out

    @property
    def choice(self) -> tuple[str | None, str | None]:
        """(none | auto | required | named | None, the named function)."""
        if isinstance(self.tool_choice, FunctionChoice):
            return "named", self.tool_choice.name
        return self.tool_choice, None

    def constraints(self) -> list[tuple[str, dict[str, Any]]]:
        """The output constraint `text.format` sets, as (field, StructuredOutputsParams kwargs)."""
        fmt = self.text.format if self.text is not None else None
        if isinstance(fmt, FormatJsonSchema):
            return [("text.format", {"json": fmt.schema_})]
        if isinstance(fmt, FormatJsonObject):
            return [("text.format", {"json_object": True})]
        return []


# ---- what the server answers ------------------------------------------------------------------------------------


class OutputMessage(ResponseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: _STATUS = "completed"
    content: list[dict[str, Any]] = Field(default_factory=list)  # output_text parts


class OutputFunctionCall(ResponseModel):
    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str
    status: _STATUS = "completed"


class ResponseUsage(ResponseModel):
    input_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens: int
    output_tokens_details: dict[str, int]
    total_tokens: int


class ResponseObject(ResponseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: float = Field(default_factory=time.time)
    completed_at: float | None = None
    status: Literal["completed", "failed", "in_progress", "cancelled", "incomplete"]
    error: dict[str, Any] | None = None
    incomplete_details: dict[str, Any] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[OutputMessage | OutputFunctionCall] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: dict[str, Any] = Field(default_factory=lambda: {"effort": None, "summary": None})
    store: bool = False
    temperature: float | None = None
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: Any = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    top_p: float | None = None
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    background: bool = False
    service_tier: str = "default"


class DeletedResponse(ResponseModel):
    id: str
    object: Literal["response.deleted"] = "response.deleted"
    deleted: bool = True
