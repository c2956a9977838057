"""`llama3_json`: Llama 3.1 / 3.2 / 3.3's JSON tool calls, `{"name": ..., "parameters": {...}}`, one or more separated
by `;`, optionally after `<|python_tag|>`. An output is calls only when it starts (after whitespace) with one; any
other output is text. Whole, an output whose calls do not all parse is text, as the model wrote it."""

from __future__ import annotations

from keel.entrypoints.openai.tool_parsers.abstract import CallReader, Event, Text, ToolParser, partial_suffix

PYTHON_TAG = "<|python_tag|>"
_WS = " \t\r\n"


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    markers = (PYTHON_TAG, '"parameters": ')
    keeps_special_tokens = True  # <|python_tag|> is a special token

    def __init__(self, *, stream: bool = True) -> None:
        super().__init__(stream=stream)
        self._all: list[str] = []  # the whole output (whole mode: the text when a call does not parse)
        self._buf = ""
        self._mode = "lead"  # lead (undecided) | calls | text
        self._reader: CallReader | None = None
        self._held: list[Event] = []
        self._bad = False

    def feed(self, delta: str) -> list[Event]:
        self._all.append(delta)
        self._buf += delta
        events: list[Event] = []
        while self._buf:
            if self._mode == "text":
                events.append(Text(self._buf))
                self._buf = ""
            elif self._mode == "lead":
                if not self._lead():
                    break
            elif not self._calls(events):
                break
        return events if self.stream else []

    def _lead(self) -> bool:
        """Decide what the output is from its first characters; False while undecided."""
        stripped = self._buf.lstrip(_WS)
        if stripped.startswith(PYTHON_TAG):
            self._buf = stripped[len(PYTHON_TAG) :]
            return True
        if not stripped or (partial_suffix(stripped, PYTHON_TAG) == len(stripped)):
            return False
        if stripped[0] == "{":
            self._mode, self._buf = "calls", stripped
        else:
            self._mode = "text"  # the whole buffer (leading whitespace included) is content
        return True

    def _calls(self, events: list[Event]) -> bool:
        """Read call objects and their separators; False when more text is needed."""
        if self._reader is not None and not self._reader.done:
            got, self._buf = self._reader.feed(self._buf)
            if self._reader.failed:
                self._fail(events, self._reader.raw())
            else:
                (events if self.stream else self._held).extend(got)
            return self._reader.done
        stripped = self._buf.lstrip(_WS + ";")
        self._buf = stripped
        if not stripped:
            return False
        if stripped[0] == "{":
            self._reader = CallReader(self, self.stream)
            return True
        self._fail(events, "")
        return True

    def _fail(self, events: list[Event], raw: str) -> None:
        """What follows is not a call: text from here on (whole mode: the whole output is text)."""
        self._bad, self._mode = True, "text"
        if raw:
            events.append(Text(raw))

    def finish(self) -> list[Event]:
        events: list[Event] = []
        if self._mode == "lead" and self._buf:
            events.append(Text(self._buf))
        reader = self._reader
        if self._mode == "calls" and reader is not None and not reader.done:
            if reader.start is not None:
                events += reader.end_announced()
            else:
                self._fail(events, reader.raw())
        self._buf = ""
        if self.stream:
            return events
        if self._bad or self._mode != "calls":
            return [Text("".join(self._all))]
        return self._held
