"""Items, both ways: a conversation's input items as chat-template messages, and a generation's output (content and
tool calls) as the response's output items, which a later request passes back or chains on."""

from __future__ import annotations

import uuid
from typing import Any

from keel.entrypoints.openai.responses.protocol import (
    FunctionCallInput,
    FunctionCallOutputInput,
    InputMessage,
    OutputFunctionCall,
    OutputMessage,
    OutputText,
    part_text,
)
from keel.entrypoints.openai.tool_parsers import ToolCall


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def to_messages(items: list[Any], instructions: str | None) -> list[dict[str, Any]]:
    """Template messages of `items` (instructions first, as the system message): a function call joins the
    assistant message before it, its output is a `tool` message; reasoning items are not rendered."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    for item in items:
        if isinstance(item, InputMessage):
            role = "system" if item.role == "developer" else item.role
            messages.append({"role": role, "content": part_text(item.content)})
        elif isinstance(item, FunctionCallInput):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputInput):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": part_text(item.output)})
    return messages


def message_item(text: str, status: str = "completed", item_id: str | None = None) -> OutputMessage:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return OutputMessage(id=item_id or new_id("msg"), status=status, content=[part])  # type: ignore[arg-type]


def call_item(call: ToolCall, status: str = "completed", item_id: str | None = None) -> OutputFunctionCall:
    return OutputFunctionCall(
        id=item_id or new_id("fc"),
        call_id=call.id,
        name=call.name,
        arguments=call.arguments,
        status=status,  # type: ignore[arg-type]
    )


def as_input(item: OutputMessage | OutputFunctionCall) -> Any:
    """An output item as the input item a chained request continues from."""
    if isinstance(item, OutputFunctionCall):
        return FunctionCallInput(
            type="function_call", call_id=item.call_id, name=item.name, arguments=item.arguments, id=item.id
        )
    parts = [OutputText(type="output_text", text=p["text"]) for p in item.content]
    return InputMessage(role="assistant", content=list(parts), id=item.id)
