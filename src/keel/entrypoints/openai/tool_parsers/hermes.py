"""`hermes`: the `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks of Qwen2 / Qwen2.5 / Qwen3 and the
Hermes models. Text outside the blocks is content; only what could still become `<tool_call>` is held back. A
block that does not hold exactly one call object stays text, tags included."""

from __future__ import annotations

from keel.entrypoints.openai.tool_parsers.abstract import (
    CallReader,
    Event,
    Text,
    ToolParser,
    partial_suffix,
)

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesParser(ToolParser):
    name = "hermes"
    markers = (OPEN,)

    def __init__(self, *, stream: bool = True) -> None:
        super().__init__(stream=stream)
        self._buf = ""  # text not yet released (outside a block) or not yet read (inside one)
        self._inside = False
        self._lead = ""  # a block's whitespace before its object
        self._plain: list[str] | None = None  # a block that does not start with an object: its text
        self._reader: CallReader | None = None
        self._tail = ""  # what follows the object up to the closing tag
        self._held: list[Event] = []  # a whole-mode block's events, released when the block closes well

    def feed(self, delta: str) -> list[Event]:
        self._buf += delta
        events: list[Event] = []
        while self._buf:
            if not self._inside:
                at = self._buf.find(OPEN)
                if at < 0:
                    keep = partial_suffix(self._buf, OPEN)
                    if len(self._buf) > keep:
                        events.append(Text(self._buf[: len(self._buf) - keep]))
                        self._buf = self._buf[len(self._buf) - keep :]
                    return events
                if at:
                    events.append(Text(self._buf[:at]))
                self._buf, self._inside = self._buf[at + len(OPEN) :], True
                self._lead, self._plain, self._reader, self._tail, self._held = "", None, None, "", []
                continue
            if not self._step(events):
                return events
        return events

    def _step(self, events: list[Event]) -> bool:
        """Read inside a block; False when it needs more text."""
        if self._reader is None and self._plain is None:
            stripped = self._buf.lstrip()
            self._lead += self._buf[: len(self._buf) - len(stripped)]
            self._buf = stripped
            if not stripped:
                return False
            if stripped[0] == "{":
                self._reader = CallReader(self, self.stream)
            else:
                self._plain = []
        if self._reader is not None and not self._reader.done:
            got, self._buf = self._reader.feed(self._buf)
            (events if self.stream else self._held).extend(got)
            return self._reader.done
        end = self._buf.find(CLOSE)
        if end < 0:
            keep = partial_suffix(self._buf, CLOSE)
            self._keep(self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep :]
            return False
        self._keep(self._buf[:end])
        self._buf, self._inside = self._buf[end + len(CLOSE) :], False
        events.extend(self._close_block(closed=True))
        return True

    def _keep(self, text: str) -> None:
        if self._plain is not None:
            self._plain.append(text)
        else:
            self._tail += text

    def _block_text(self) -> str:
        if self._reader is None:
            return self._lead + "".join(self._plain or ())
        return self._lead + self._reader.raw() + self._tail

    def _close_block(self, closed: bool) -> list[Event]:
        reader = self._reader
        if reader is not None and reader.start is not None:  # announced: it stays a call
            ended = [] if reader.done else reader.end_announced()
            tail = self._tail.strip()
            return ended + ([Text(tail)] if tail else [])
        if reader is not None and reader.result is not None and not self._tail.strip():
            return self._held
        return [Text(OPEN + self._block_text() + (CLOSE if closed else ""))]

    def finish(self) -> list[Event]:
        """The output ended: an unclosed block is a call when its object is whole, else text."""
        if not self._inside:
            rest, self._buf = self._buf, ""
            return [Text(rest)] if rest else []
        self._keep(self._buf)
        self._buf, self._inside = "", False
        return self._close_block(closed=False)
