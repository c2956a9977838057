"""Calls the grammar engine makes a model write, whatever its family: `tool_choice` "required" constrains the output to
a JSON array of `{"name": ..., "parameters": {...}}` (`required_schema`, vLLM's form), a named function to the
function's arguments object. `none` (no tools, or tool_choice "none") is all text."""

from __future__ import annotations

from typing import Any

from keel.entrypoints.openai.tool_parsers.abstract import (
    ArgsDelta,
    CallEnd,
    CallReader,
    CallStart,
    Event,
    Text,
    ToolCall,
    ToolParser,
)

_WS = " \t\r\n"


def required_schema(tools: list[dict[str, Any]], parallel: bool) -> dict[str, Any]:
    """tool_choice "required": a JSON array of {name, parameters} calls to the given tools."""
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


class PlainParser(ToolParser):
    """No tools: every character is content."""

    name = "none"

    def feed(self, delta: str) -> list[Event]:
        return [Text(delta)] if delta else []

    def finish(self) -> list[Event]:
        return []


class RequiredParser(ToolParser):
    """The JSON array `required_schema` allows; an output that is not one (cut short) stays text when read whole."""

    name = "required"

    def __init__(self, *, stream: bool = True) -> None:
        super().__init__(stream=stream)
        self._all: list[str] = []
        self._buf = ""
        self._state = "open"  # open (before "[") | items | closed | bad
        self._reader: CallReader | None = None
        self._held: list[Event] = []

    def feed(self, delta: str) -> list[Event]:
        self._all.append(delta)
        self._buf += delta
        events: list[Event] = []
        while self._buf and self._step(events):
            pass
        return events if self.stream else []

    def _step(self, events: list[Event]) -> bool:
        if self._state in ("closed", "bad"):
            if self._buf.strip() or self._state == "bad":
                self._state = "bad"
                events.append(Text(self._buf))
            self._buf = ""
            return False
        reader = self._reader
        if reader is not None and not reader.done:
            got, self._buf = reader.feed(self._buf)
            if reader.failed:
                self._state = "bad"
                events.append(Text(reader.raw()))
            else:
                (events if self.stream else self._held).extend(got)
            return reader.done
        self._buf = self._buf.lstrip(_WS + ("," if self._state == "items" else ""))
        if not self._buf:
            return False
        head = self._buf[0]
        if self._state == "open" and head == "[":
            self._buf, self._state = self._buf[1:], "items"
        elif self._state == "items" and head == "{":
            self._reader = CallReader(self, self.stream)
        elif self._state == "items" and head == "]":
            self._buf, self._state = self._buf[1:], "closed"
        else:
            self._state = "bad"
        return True

    def finish(self) -> list[Event]:
        events: list[Event] = []
        reader = self._reader
        if reader is not None and not reader.done:
            if reader.start is not None:
                events += reader.end_announced()
            else:
                self._state = "bad"
                events.append(Text(reader.raw()))
        if not self.stream:
            return self._held if self._state == "closed" else [Text("".join(self._all))]
        return events


class NamedParser(ToolParser):
    """tool_choice names a function: the whole output is its arguments."""

    name = "named"

    def __init__(self, function: str, *, stream: bool = True) -> None:
        super().__init__(stream=stream)
        self.function = function
        self._start: CallStart | None = None
        self._args: list[str] = []

    def feed(self, delta: str) -> list[Event]:
        self._args.append(delta)
        if not self.stream:
            return []
        events: list[Event] = []
        if self._start is None:
            self._start = CallStart(self.next_index(), self.new_id(), self.function)
            events.append(self._start)
        if delta:
            events.append(ArgsDelta(self._start.index, delta))
        return events

    def finish(self) -> list[Event]:
        args = "".join(self._args)
        if self._start is None:
            self._start = CallStart(self.next_index(), self.new_id(), self.function)
            head: list[Event] = [self._start, ArgsDelta(self._start.index, args)] if args else [self._start]
        else:
            head = []
        return [*head, CallEnd(self._start.index, ToolCall(self.function, args, self._start.id))]
