"""`mistral`: Mistral's `[TOOL_CALLS]` calls, in both of its tokenizers' forms: a JSON array after the marker
(`[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`, tokenizers up to v7) or the name and its arguments after
each marker (`[TOOL_CALLS]name[ARGS]{...}`, optionally `[CALL_ID]id` before `[ARGS]`, v11 and later). Text before
the first marker is content; whole, an output whose calls after the marker do not all parse is text. Call ids are
nine letters and digits, the only ids Mistral's chat templates accept back."""

from __future__ import annotations

import json
import random
import re
import string

from keel.entrypoints.openai.tool_parsers.abstract import (
    ArgsDelta,
    CallEnd,
    CallReader,
    CallStart,
    Event,
    JsonSpan,
    Text,
    ToolCall,
    ToolParser,
    partial_suffix,
)

MARKER, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_WS = " \t\r\n"
_NAME = re.compile(r"[A-Za-z0-9_.\-]*")
_ID_CHARS = string.ascii_letters + string.digits


class MistralParser(ToolParser):
    name = "mistral"
    markers = (MARKER,)
    keeps_special_tokens = True  # [TOOL_CALLS] and [ARGS] are special tokens

    def __init__(self, *, stream: bool = True) -> None:
        super().__init__(stream=stream)
        self._buf = ""
        self._state = "text"  # text | marker | array | name | call_id | args | rest (not calls: text)
        self._after: list[str] = []  # everything from the first marker on (whole mode: the text if calls fail)
        self._seen = False  # a marker was read
        self._held: list[Event] = []
        self._bad = False
        self._reader: CallReader | None = None
        self._name = ""
        self._start: CallStart | None = None
        self._args: list[str] = []
        self._span = JsonSpan()

    def new_id(self) -> str:
        return "".join(random.choices(_ID_CHARS, k=9))

    def feed(self, delta: str) -> list[Event]:
        if self._seen:
            self._after.append(delta)
        self._buf += delta
        events: list[Event] = []
        while self._buf and self._step(events):
            pass
        return events

    def _sink(self, events: list[Event]) -> list[Event]:
        """Where events go: to the caller, or (whole mode, after a marker) held until the output is known good."""
        return self._held if self._seen and not self.stream else events

    def _step(self, events: list[Event]) -> bool:
        """Advance the state machine on the buffer; False when it needs more text."""
        state = self._state
        if state == "text":
            return self._text(events)
        if state == "rest":
            self._sink(events).append(Text(self._buf))
            self._buf = ""
            return False
        if state == "marker":
            self._buf = self._buf.lstrip(_WS)
            if not self._buf:
                return False
            if self._buf[0] == "[":
                self._buf, self._state = self._buf[1:], "array"
            else:
                self._state, self._name = "name", ""
            return True
        if state == "array":
            return self._array(events)
        if state in ("name", "call_id"):
            return self._name_part(events)
        return self._args_part(events)

    def _text(self, events: list[Event]) -> bool:
        at = self._buf.find(MARKER)
        if at < 0:
            keep = partial_suffix(self._buf, MARKER)
            if len(self._buf) > keep:
                self._sink(events).append(Text(self._buf[: len(self._buf) - keep]))
                self._buf = self._buf[len(self._buf) - keep :]
            return False
        if at:
            self._sink(events).append(Text(self._buf[:at]))
        if not self._seen:
            self._seen = True
            self._after.append(self._buf[at:])
        self._buf, self._state = self._buf[at + len(MARKER) :], "marker"
        return True

    def _array(self, events: list[Event]) -> bool:
        reader = self._reader
        if reader is not None and not reader.done:
            got, self._buf = reader.feed(self._buf)
            if reader.failed:
                return self._fail(events, reader.raw())
            self._sink(events).extend(got)
            return reader.done
        self._buf = self._buf.lstrip(_WS + ",")
        if not self._buf:
            return False
        if self._buf[0] == "{":
            self._reader = CallReader(self, self.stream)
        elif self._buf[0] == "]":
            self._buf, self._state, self._reader = self._buf[1:], "text", None
        else:
            return self._fail(events, "")
        return True

    def _name_part(self, events: list[Event]) -> bool:
        tags = (ARGS,) if self._state == "call_id" else (CALL_ID, ARGS)
        found = [(at, tag) for tag in tags if (at := self._buf.find(tag)) >= 0]
        if found:
            at, tag = min(found)
            part, self._buf = self._buf[:at], self._buf[at + len(tag) :]
            if self._state == "name":
                self._name += part
            if not self._name or _NAME.fullmatch(self._name) is None:
                return self._fail(events, self._name)
            self._state = "call_id" if tag == CALL_ID else "args"
            if tag == ARGS:
                self._begin_args(events)
            return True
        keep = max(partial_suffix(self._buf, tag) for tag in tags)
        if self._state == "name":
            self._name += self._buf[: len(self._buf) - keep]
            if _NAME.fullmatch(self._name) is None:
                return self._fail(events, self._name)
        self._buf = self._buf[len(self._buf) - keep :]
        return False

    def _begin_args(self, events: list[Event]) -> None:
        self._args, self._span, self._start = [], JsonSpan(), None
        if self.stream:
            self._start = CallStart(self.next_index(), self.new_id(), self._name)
            events.append(self._start)

    def _args_part(self, events: list[Event]) -> bool:
        if not self._args:
            self._buf = self._buf.lstrip(_WS)
            if not self._buf:
                return False
            if self._buf[0] != "{":
                return self._fail(events, "")
        taken = len(self._buf)
        for i, ch in enumerate(self._buf):
            if self._span.push(ch):
                taken = i + 1
                break
        piece, self._buf = self._buf[:taken], self._buf[taken:]
        self._args.append(piece)
        if self._start is not None and piece:
            events.append(ArgsDelta(self._start.index, piece))
        if self._span.depth:
            return False
        return self._end_args(events)

    def _end_args(self, events: list[Event]) -> bool:
        args = "".join(self._args)
        self._state = "text"
        if self._start is not None:
            events.append(CallEnd(self._start.index, ToolCall(self._name, args, self._start.id)))
            return True
        try:
            ok = isinstance(json.loads(args), dict)
        except json.JSONDecodeError:
            ok = False
        if not ok:
            return self._fail(events, args)
        call, index = ToolCall(self._name, args, self.new_id()), self.next_index()
        self._held += [CallStart(index, call.id, call.name), ArgsDelta(index, args), CallEnd(index, call)]
        return True

    def _fail(self, events: list[Event], raw: str) -> bool:
        """What follows is not a call: text from here on (whole mode: everything from the first marker)."""
        self._bad, self._state = True, "rest"
        if raw:
            self._sink(events).append(Text(raw))
        return True

    def finish(self) -> list[Event]:
        events: list[Event] = []
        sink = self._sink(events)
        if self._state == "args" and self._start is not None:
            sink.append(CallEnd(self._start.index, ToolCall(self._name, "".join(self._args), self._start.id)))
        elif self._state == "array" and self._reader is not None and self._reader.start is not None:
            if not self._reader.done:
                sink += self._reader.end_announced()
        elif self._state in ("text", "rest"):
            if self._buf:
                sink.append(Text(self._buf))
        else:  # cut inside a call that was not announced: what it wrote is text
            self._bad = True
            reader = self._reader
            raw = reader.raw() if self._state == "array" and reader is not None and not reader.done else ""
            raw = self._name if self._state in ("name", "call_id") else raw + "".join(self._args)
            if raw:
                sink.append(Text(raw))
        self._buf = ""
        if self.stream or not self._seen:
            return events
        if self._bad:
            return [Text("".join(self._after))]
        return self._held
