"""Tool calls out of model text: the Hermes-style `<tool_call>{json}</tool_call>` blocks Qwen2.5/Qwen3 emit.

`parse_hermes` splits a whole output into content and calls; `HermesStreamParser` does the same on
text deltas, holding back only what could still become a `<tool_call>` tag, so plain content streams
as it comes and each call is released once its closing tag has arrived. A block whose JSON does not
parse, or has no string `name`, stays content (the client sees what the model wrote).
Also the JSON schemas that make any model produce a valid call under `tool_choice` required / named.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass(slots=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as a string (OpenAI's function.arguments)
    id: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or f"call_{uuid.uuid4().hex[:24]}"

    def body(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def call_from_json(obj: Any) -> ToolCall | None:
    """{"name": str, "arguments" or "parameters": object or JSON string} -> a call, else None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def _block(inner: str) -> ToolCall | None:
    try:
        return call_from_json(json.loads(inner))
    except json.JSONDecodeError:
        return None


def parse_hermes(text: str) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of a whole output; content is None when only calls (and whitespace) were written."""
    parser = HermesStreamParser()
    parts, calls = [], []
    for kind, value in parser.feed(text) + parser.finish():
        if kind == "content":
            parts.append(value)
        else:
            calls.append(value)
    content = "".join(parts)
    if calls and not content.strip():
        return None, calls
    return content.strip() if calls else content, calls


class HermesStreamParser:
    """Incremental `parse_hermes`: feed text deltas, get ("content", str) and ("call", ToolCall) events."""

    def __init__(self) -> None:
        self._buf = ""
        self._inside = False

    def feed(self, delta: str) -> list[tuple[str, Any]]:
        self._buf += delta
        events: list[tuple[str, Any]] = []
        while True:
            if not self._inside:
                at = self._buf.find(OPEN)
                if at < 0:
                    keep = _partial_suffix(self._buf, OPEN)
                    if len(self._buf) > keep:
                        events.append(("content", self._buf[: len(self._buf) - keep]))
                        self._buf = self._buf[len(self._buf) - keep :]
                    return events
                if at:
                    events.append(("content", self._buf[:at]))
                self._buf, self._inside = self._buf[at + len(OPEN) :], True
            end = self._buf.find(CLOSE)
            if end < 0:
                return events
            inner, self._buf, self._inside = self._buf[:end], self._buf[end + len(CLOSE) :], False
            call = _block(inner)
            events.append(("call", call) if call is not None else ("content", OPEN + inner + CLOSE))

    def finish(self) -> list[tuple[str, Any]]:
        """The end of the output: an unclosed block is parsed if its JSON is whole, else returned as content."""
        rest, inside = self._buf, self._inside
        self._buf, self._inside = "", False
        if not rest and not inside:
            return []
        if inside:
            call = _block(rest)
            return [("call", call)] if call is not None else [("content", OPEN + rest)]
        return [("content", rest)]


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def required_schema(tools: list[dict[str, Any]], parallel: bool) -> dict[str, Any]:
    """tool_choice "required": a JSON array of {name, parameters} calls to the given tools (vLLM's form)."""
    variants = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [t["name"]]},
                "parameters": t.get("parameters") or {"type": "object", "properties": {}},
            },
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": variants}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def calls_from_required(text: str) -> list[ToolCall]:
    """The calls of a tool_choice "required" output (a JSON array of {name, parameters})."""
    try:
        items = json.loads(text)
    except json.JSONDecodeError:
        return []
    if not isinstance(items, list):
        return []
    calls = [call_from_json(item) for item in items]
    return [c for c in calls if c is not None]
