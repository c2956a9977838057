"""C, C++, CUDA and HIP source read as the compiler's first phases read it: comments and string or
character literals (raw strings, prefixes, line continuations, digit separators) are blanked out, so
that nothing inside them can look like code, and preprocessor lines are split off as directives.

Blanking keeps every offset, line and column, so the rule matchers (rules.py) run compiled patterns
over the blanked text in the regex engine and map hits back to the original source.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

# The first character decides which literal can start here (the lookahead lets the engine skip every
# other position quickly). A quote inside a number is a digit separator (1'000): `num` consumes such
# numbers whole; a quote right after any other identifier character is part of a literal prefix.
_LITERALS = re.compile(
    r"""(?=[/"'RuUL0-9])(?:
      (?P<lc>//(?:[^\n\\]|\\\r?\n|\\)*)
    | (?P<bc>/\*(?s:.*?)(?:\*/|\Z))
    | (?P<raw>(?:u8|[uUL])?R"(?P<delim>[^ ()\\\t\v\f\n"]{0,16})\((?s:.*?)\)(?P=delim)")
    | (?:u8|[uUL])?(?P<str>"(?:[^"\\\n]|\\(?:\r?\n|.))*(?:"|(?=\n)|\Z))
    | (?<![0-9A-Za-z_.])(?:u8|[uUL])?(?P<chr>'(?:[^'\\\n]|\\.)*(?:'|(?=\n)|\Z))
    | (?P<num>(?<![A-Za-z_0-9.])[0-9](?:[eEpP][+-]|[0-9A-Za-z_.])*'(?:[eEpP][+-]|'(?=[0-9A-Za-z_])|[0-9A-Za-z_.])*)
    )""",
    re.VERBOSE,
)
_NOT_NEWLINE = re.compile(r"[^\n]")
# a directive: '#' first on a line (after blanks), its name, and the rest of the logical line; the
# search starts at the '#' (a literal the engine finds fast), the blanks before it are checked after
_DIRECTIVE = re.compile(r"(?:#|%:)[ \t]*(\w*)((?:[^\n\\]+|\\\r?\n|\\)*)")


def mask(text: str) -> str:
    """`text` with every comment and literal replaced by blanks of the same length (newlines kept).
    A string keeps its quotes so that `"a" "b"` still reads as two literals."""
    parts: list[str] = []
    pos = 0
    for m in _LITERALS.finditer(text):
        kind = m.lastgroup
        if kind is None or kind == "num":
            continue
        start, end = m.span(kind)
        piece = text[start:end]
        blank = _NOT_NEWLINE.sub(" ", piece) if "\n" in piece else " " * len(piece)
        if kind in ("str", "chr") and len(piece) >= 2 and piece[-1] == piece[0]:
            blank = piece[0] + blank[1:-1] + piece[-1]
        parts.append(text[pos:start])
        parts.append(blank)
        pos = end
    parts.append(text[pos:])
    return "".join(parts)


@dataclass(frozen=True, slots=True)
class Directive:
    """One preprocessor line of the blanked text: its name (`include`, `if`, `define`, ...), the
    rest of its logical line (continuations kept), and where the line and the rest start."""

    name: str
    rest: str
    start: int
    rest_start: int
    end: int


def directives(masked: str) -> list[Directive]:
    """Every directive of a blanked file, in order."""
    out: list[Directive] = []
    pos = 0
    while True:
        m = _DIRECTIVE.search(masked, pos)
        if m is None:
            return out
        line_start = masked.rfind("\n", 0, m.start()) + 1
        if masked[line_start : m.start()].strip(" \t"):
            pos = m.start() + 1  # a '#' inside a line: stringizing or pasting in a macro body
            continue
        out.append(Directive(m.group(1), m.group(2), line_start, m.start(2), m.end()))
        pos = m.end()


class LineIndex:
    """Offsets of a text to 1-based (line, column); a column counts characters (code points). The
    line starts are found on the first question (most files of a stable project have no finding)."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._starts: list[int] | None = None

    def _lines(self) -> list[int]:
        if self._starts is None:
            starts, pos = [0], 0
            for length in map(len, self._text.split("\n")):
                pos += length + 1
                starts.append(pos)
            self._starts = starts[:-1]
        return self._starts

    def position(self, offset: int) -> tuple[int, int]:
        """(line, column) of `offset`."""
        starts = self._lines()
        line = bisect.bisect_right(starts, offset)
        return line, offset - starts[line - 1] + 1

    def line_start(self, line: int) -> int:
        """Offset of the first character of 1-based `line`."""
        return self._lines()[line - 1]
