"""The preprocessor conditionals of one file: which regions no build can compile (`#if 0`, the
`#else` of `#if 1`, `#if 0 && X`, ...) and which sit under a torch feature-version guard
(`#if TORCH_FEATURE_VERSION >= TORCH_VERSION_2_11_0`).

A condition is evaluated with three values: a number, or unknown. Macros the build defines
(`USE_ROCM`, `__CUDACC__`, include guards) are unknown, so both of their branches count as code;
only what is false whatever the build defines is disabled.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .lexer import Directive

Version = tuple[int, int]

_TOKEN = re.compile(
    r"\s*(?:(0[xX][0-9a-fA-F]+|[0-9]+)[uUlL]*|([A-Za-z_]\w*)|(&&|\|\||==|!=|<=|>=|<<|>>|[-+*/%<>!()?:~&|^,]))"
)
_FEATURE_MACROS = frozenset({"TORCH_FEATURE_VERSION", "TORCH_TARGET_VERSION"})
_VERSION_NAME = re.compile(r"TORCH_VERSION_(\d+)_(\d+)_\d+$")
_BINARY = {
    "||": 1,
    "&&": 2,
    "|": 3,
    "^": 4,
    "&": 5,
    "==": 6,
    "!=": 6,
    "<": 7,
    ">": 7,
    "<=": 7,
    ">=": 7,
    "<<": 8,
    ">>": 8,
    "+": 9,
    "-": 9,
    "*": 10,
    "/": 10,
    "%": 10,
}


class _Unparsable(Exception):
    pass


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    text = text.replace("\\\n", " ").strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise _Unparsable(text[pos:])
        out.append(m.group(1) or m.group(2) or m.group(3))
        pos = m.end()
    return out


def _apply(op: str, a: int | None, b: int | None) -> int | None:
    """A binary operator on three-valued operands: `0 && x` is 0 and `1 || x` is 1 whatever x is."""
    if op == "&&":
        return 0 if a == 0 or b == 0 else (None if a is None or b is None else 1)
    if op == "||":
        return (
            1 if (a is not None and a != 0) or (b is not None and b != 0) else (None if a is None or b is None else 0)
        )
    if a is None or b is None:
        return None
    if op in ("/", "%") and b == 0:
        return None
    return _arith(op, a, b)


def _arith(op: str, a: int, b: int) -> int:
    """A binary operator on two known operands (`/` and `%` by a non-zero divisor)."""
    if op in ("<<", ">>"):
        if not 0 <= b < 64:
            return 0
        return a << b if op == "<<" else a >> b
    if op == "/":
        return int(a / b)
    results = {
        "|": a | b,
        "^": a ^ b,
        "&": a & b,
        "==": int(a == b),
        "!=": int(a != b),
        "<": int(a < b),
        ">": int(a > b),
        "<=": int(a <= b),
        ">=": int(a >= b),
        "+": a + b,
        "-": a - b,
        "*": a * b,
        "%": a % b,
    }
    return results[op]


class _Parser:
    """Precedence climbing over the tokens of one `#if` condition."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        if self.pos >= len(self.tokens):
            raise _Unparsable("unexpected end")
        self.pos += 1
        return self.tokens[self.pos - 1]

    def expression(self, level: int = 0) -> int | None:
        value = self.unary()
        while True:
            op = self.peek()
            if op == "?" and level == 0:
                self.take()
                yes = self.expression()
                if self.take() != ":":
                    raise _Unparsable("?:")
                no = self.expression()
                value = None if value is None else (yes if value else no)
                continue
            if op not in _BINARY or _BINARY[op] <= level:
                return value
            self.take()
            value = _apply(op, value, self.expression(_BINARY[op]))

    def unary(self) -> int | None:
        tok = self.take()
        if tok == "(":
            value = self.expression()
            if self.take() != ")":
                raise _Unparsable(")")
            return value
        if tok in ("!", "-", "+", "~"):
            inner = self.unary()
            if inner is None:
                return None
            return {"!": int(not inner), "-": -inner, "+": inner, "~": ~inner}[tok]
        if tok == "defined":
            if self.peek() == "(":
                self.take()
                self.take()
                if self.take() != ")":
                    raise _Unparsable("defined(")
            else:
                self.take()
            return None
        if tok[0].isdigit():
            return int(tok, 16) if tok[:2] in ("0x", "0X") else int(tok, 8) if tok.startswith("0") else int(tok)
        if tok in ("true", "false"):
            return int(tok == "true")
        if tok[0].isalpha() or tok[0] == "_":
            if self.peek() == "(":  # a function-like macro: skip its arguments
                depth = 0
                while True:
                    t = self.take()
                    depth += (t == "(") - (t == ")")
                    if depth == 0:
                        break
            return None
        raise _Unparsable(tok)


def evaluate(condition: str) -> int | None:
    """The value of an `#if` condition, or None when it depends on the build (or cannot be read)."""
    try:
        parser = _Parser(_tokens(condition))
        value = parser.expression()
        return value if parser.pos == len(parser.tokens) else None
    except (_Unparsable, ValueError, IndexError, OverflowError, RecursionError):
        return None


def _version_operand(tok: str) -> Version | None:
    m = _VERSION_NAME.match(tok)
    if m:
        return int(m.group(1)), int(m.group(2))
    if tok[:2] in ("0x", "0X"):
        value = int(tok, 16)
        return (value >> 56) & 0xFF, (value >> 48) & 0xFF
    return None


def feature_guard(condition: str) -> tuple[Version | None, Version | None]:
    """The torch feature version that the `#if` branch and the `#else` branch each require:
    `TORCH_FEATURE_VERSION >= TORCH_VERSION_2_11_0` -> ((2, 11), None); `<` -> (None, (2, 11));
    a conjunction takes the highest guard of its terms."""
    try:
        tokens = _tokens(condition)
    except _Unparsable:
        return None, None
    if "||" in tokens:
        return None, None
    yes: Version | None = None
    no: Version | None = None
    for i, tok in enumerate(tokens):
        if tok not in _FEATURE_MACROS or i + 2 >= len(tokens):
            continue
        op, operand = tokens[i + 1], _version_operand(tokens[i + 2])
        if operand is None:
            continue
        if op in (">=", ">"):
            yes = max(yes or operand, operand)
        elif op == "<" and len(tokens) == 3:
            no = operand
    return yes, no


@dataclass
class Regions:
    """Disabled spans and guarded spans of a file, as sorted (start, end[, version]) offsets."""

    disabled: list[tuple[int, int]] = field(default_factory=list)
    guarded: list[tuple[int, int, Version]] = field(default_factory=list)
    # live branches after an earlier live branch of the same conditional (`#else` of `#ifdef X`):
    # a reader that follows braces takes one branch only, as the compiler does
    alternative: list[tuple[int, int]] = field(default_factory=list)
    unbalanced: bool = False


@dataclass
class _Frame:
    parent_live: bool
    live: bool  # this branch may be compiled
    taken: bool  # an earlier branch is surely compiled
    seen: bool  # an earlier branch may have been compiled
    start: int
    guard: Version | None
    else_guard: Version | None


def regions(items: list[Directive], length: int) -> Regions:
    """Walk the conditionals of a file and collect its disabled and guarded spans."""
    out = Regions()
    stack: list[_Frame] = []
    for d in items:
        name = d.name
        if name in ("if", "ifdef", "ifndef", "elif", "elifdef", "elifndef"):
            cond = d.rest if name in ("if", "elif") else None
            value = evaluate(cond) if cond is not None else None
            guard, else_guard = feature_guard(cond) if cond is not None else (None, None)
            if name.startswith("if"):
                live = (not stack or stack[-1].live) and value != 0
                stack.append(
                    _Frame(not stack or stack[-1].live, live, value not in (None, 0), False, d.end, guard, else_guard)
                )
                continue
            if not stack:
                out.unbalanced = True
                continue
            frame = stack[-1]
            _close(out, frame, d.start)
            frame.live = frame.parent_live and not frame.taken and value != 0
            frame.taken = frame.taken or value not in (None, 0)
            frame.start, frame.guard, frame.else_guard = d.end, guard, None
        elif name == "else":
            if not stack:
                out.unbalanced = True
                continue
            frame = stack[-1]
            _close(out, frame, d.start)
            frame.live = frame.parent_live and not frame.taken
            frame.start, frame.guard, frame.else_guard = d.end, frame.else_guard, None
        elif name == "endif":
            if not stack:
                out.unbalanced = True
                continue
            _close(out, stack.pop(), d.start)
    for frame in reversed(stack):
        out.unbalanced = True
        _close(out, frame, length)
    out.disabled.sort()
    out.guarded.sort()
    out.alternative.sort()
    return out


def _close(out: Regions, frame: _Frame, end: int) -> None:
    """Record the branch that ends at `end`."""
    if frame.parent_live and not frame.live:
        out.disabled.append((frame.start, end))
    elif frame.guard is not None:
        out.guarded.append((frame.start, end, frame.guard))
    if frame.live and frame.seen:
        out.alternative.append((frame.start, end))
    frame.seen = frame.seen or frame.live
