"""What every tool-call parser shares: the call, the events a parser emits, and the reader of one JSON call object.

A parser is fed the model's text as it is released and emits `Text`, `CallStart`, `ArgsDelta` and `CallEnd` events;
each API renders those events its own way (chat's `delta.tool_calls`, Responses' `function_call` items, Messages'
`tool_use` blocks). Fed whole (`stream=False`), a parser checks each call before it emits it, and a call that does
not parse stays text. Streaming (`stream=True`), a call is announced as soon as its name and the opening brace of
its arguments are read, and the arguments follow as they are written; a call that breaks after that point ends with
the arguments as the model wrote them (a stream cannot take back what it sent).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(slots=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object as text (OpenAI's function.arguments)
    id: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or f"call_{uuid.uuid4().hex[:24]}"

    def body(self) -> dict[str, Any]:
        """The call as chat completions' `tool_calls[]` entry."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def input(self) -> dict[str, Any]:
        """The arguments as an object (Anthropic's `tool_use.input`); {} when they are not a JSON object."""
        try:
            value = json.loads(self.arguments)
        except json.JSONDecodeError:
            return {}
        return value if isinstance(value, dict) else {}


@dataclass(slots=True, frozen=True)
class Text:
    text: str


@dataclass(slots=True, frozen=True)
class CallStart:
    index: int  # the call's position among this output's calls
    id: str
    name: str


@dataclass(slots=True, frozen=True)
class ArgsDelta:
    index: int
    text: str


@dataclass(slots=True, frozen=True)
class CallEnd:
    index: int
    call: ToolCall  # the arguments are the concatenation of the call's ArgsDelta texts


Event = Text | CallStart | ArgsDelta | CallEnd

_WS = " \t\r\n"
NAME_KEYS = ("name",)
ARGS_KEYS = ("arguments", "parameters")
_MAX_HEADER = 1024  # characters before the arguments: past this the object is read whole


def call_from_json(obj: Any, new_id: str = "") -> ToolCall | None:
    """{"name": str, "arguments" or "parameters": object or its JSON text} -> a call, else None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False), new_id)


def _string_end(text: str, start: int) -> int:
    """Index after the JSON string that opens at `start` (a quote), or -1 when the text ends inside it."""
    i, n = start + 1, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == '"':
            return i + 1
        i += 1
    return -1


def probe_header(text: str) -> tuple[str, int] | bool | None:
    """Read `{"name": "f", "arguments": {` at the start of a call object (a string "type" may come first):
    (name, index of the arguments' "{") once it is there, None while more text is needed, False when the object
    has another shape (it is then read whole)."""
    if len(text) > _MAX_HEADER:
        return False
    i, n, name = 0, len(text), None
    if n == 0:
        return None
    if text[0] != "{":
        return False
    i = 1
    while True:
        while i < n and text[i] in _WS:
            i += 1
        if i >= n:
            return None
        if text[i] == ",":
            i += 1
            continue
        if text[i] != '"':
            return False
        end = _string_end(text, i)
        if end < 0:
            return None
        key = json.loads(text[i:end])
        i = end
        while i < n and text[i] in _WS:
            i += 1
        if i >= n:
            return None
        if text[i] != ":":
            return False
        i += 1
        while i < n and text[i] in _WS:
            i += 1
        if i >= n:
            return None
        if key in ARGS_KEYS:
            return (name, i) if name and text[i] == "{" else False
        if key not in ("name", "type") or text[i] != '"':
            return False
        end = _string_end(text, i)
        if end < 0:
            return None
        value = json.loads(text[i:end])
        if key == "name":
            name = value
        i = end


@dataclass(slots=True)
class JsonSpan:
    """Where a JSON object or array written a character at a time closes: bracket depth outside strings."""

    depth: int = 0
    in_string: bool = False
    escaped: bool = False

    def push(self, ch: str) -> bool:
        """Take one character; True when it closes the outermost value."""
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_string = False
            return False
        if ch == '"':
            self.in_string = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1
            return self.depth == 0
        return False


@dataclass
class CallReader:
    """One JSON call object, from its "{" to its matching "}", read as it is written (see the module's docstring)."""

    parser: ToolParser
    stream: bool
    text: list[str] = field(default_factory=list)
    span: JsonSpan = field(default_factory=JsonSpan)
    start: CallStart | None = None  # the announced call (streaming)
    args_at: int = -1  # where the arguments object starts in the text
    args_span: JsonSpan = field(default_factory=JsonSpan)
    args_end: int = -1  # index after the arguments object, once it closed
    sent: int = 0  # characters of the arguments already emitted
    probing: bool = True
    result: ToolCall | None = None
    failed: bool = False

    @property
    def done(self) -> bool:
        return self.result is not None or self.failed

    def feed(self, chunk: str) -> tuple[list[Event], str]:
        """Read `chunk` up to where the object closes: (events, the rest of the chunk after the object)."""
        rest, before = "", len(self.text)
        for i, ch in enumerate(chunk):
            self.text.append(ch)
            if self.span.push(ch):
                rest = chunk[i + 1 :]
                break
        events = self._announce(before)
        if self.span.depth == 0 and self.text:
            events += self._close()
        return events, rest

    def _announce(self, before: int) -> list[Event]:
        """Streaming: announce the call once its header is read, then pass the arguments' new characters on."""
        events: list[Event] = []
        if not self.stream:
            return events
        if self.start is None and self.probing:
            found = probe_header("".join(self.text))
            if found is False:
                self.probing = False
            elif found is not None:
                assert not isinstance(found, bool)
                index = self.parser.next_index()
                self.start = CallStart(index, self.parser.new_id(), found[0])
                self.args_at = before = found[1]
                events.append(self.start)
        if self.start is None:
            return events
        for k in range(max(before, self.args_at), len(self.text)):
            if self.args_end < 0 and self.args_span.push(self.text[k]):
                self.args_end = k + 1
        stop = self.args_end if self.args_end >= 0 else len(self.text)
        if stop > self.args_at + self.sent:
            events.append(ArgsDelta(self.start.index, "".join(self.text[self.args_at + self.sent : stop])))
            self.sent = stop - self.args_at
        return events

    def _close(self) -> list[Event]:
        """The object closed: end the announced call, or parse the object whole."""
        if self.start is not None:
            return self.end_announced()
        try:
            call = call_from_json(json.loads("".join(self.text)), self.parser.new_id())
        except json.JSONDecodeError:
            call = None
        if call is None:
            self.failed = True
            return []
        self.result = call
        index = self.parser.next_index()
        return [CallStart(index, call.id, call.name), ArgsDelta(index, call.arguments), CallEnd(index, call)]

    def end_announced(self) -> list[Event]:
        """End the announced call with the arguments sent so far (all of them once the object closed)."""
        assert self.start is not None
        stop = self.args_end if self.args_end >= 0 else len(self.text)
        args = "".join(self.text[self.args_at : stop])
        self.result = ToolCall(self.start.name, args, self.start.id)
        return [CallEnd(self.start.index, self.result)]

    def raw(self) -> str:
        return "".join(self.text)


class ToolParser:
    """A model family's tool-call format, fed text as the model writes it (`feed`, then `finish` at the end)."""

    name: ClassVar[str] = ""
    markers: ClassVar[tuple[str, ...]] = ()  # what in a chat template shows this format (`auto` reads them)
    keeps_special_tokens: ClassVar[bool] = False  # its markers are special tokens: the text must keep them

    def __init__(self, *, stream: bool = True) -> None:
        self.stream = stream
        self._count = 0

    def next_index(self) -> int:
        self._count += 1
        return self._count - 1

    def new_id(self) -> str:
        return f"call_{uuid.uuid4().hex[:24]}"

    def feed(self, delta: str) -> list[Event]:
        raise NotImplementedError

    def finish(self) -> list[Event]:
        raise NotImplementedError

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """A whole output's (content, calls); content is None when the calls are all there is."""
        events = self.feed(text) + self.finish()
        content = "".join(e.text for e in events if isinstance(e, Text))
        calls = [e.call for e in events if isinstance(e, CallEnd)]
        if calls and not content.strip():
            return None, calls
        return (content.strip() if calls else content), calls


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag` (text that may yet become the tag)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class TextGate:
    """Streamed content around tool calls: whitespace is held back until more text follows, so a stream opens no
    message for the newlines between calls, and (as a whole output's content is stripped when it holds calls) the
    whitespace before a call or at the end of an output with calls is dropped."""

    def __init__(self) -> None:
        self._held = ""
        self.calls = 0

    def text(self, text: str) -> str:
        """What of `text` to send now."""
        body = (self._held + text).rstrip()
        if not body:
            self._held += text
            return ""
        self._held = (self._held + text)[len(body) :]
        return body

    def call(self) -> None:
        """A call starts: the whitespace before it goes."""
        self._held = ""
        self.calls += 1

    def end(self) -> str:
        """The output ended: its trailing whitespace, unless it made calls."""
        held, self._held = self._held, ""
        return "" if self.calls else held
