"""--fix: a unified diff of the substitutions that need no judgement (includes, checks, registration
macros with their kernels boxed, dispatch macros, type names, the simple tensor methods); every
other finding stays in the report as a hand change."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from .lexer import mask
from .scan import Finding

_IMPL = re.compile(r"\.\s*impl\s*\(")


@dataclass(frozen=True)
class Edit:
    start: int
    end: int
    text: str


def _close_paren(code: str, open_at: int) -> int | None:
    """Offset of the ')' matching the '(' at `open_at` in blanked code."""
    depth = 0
    for i in range(open_at, len(code)):
        ch = code[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return i if ch == ")" else None
    return None


def _arguments(code: str, open_at: int) -> list[tuple[int, int]] | None:
    """Spans of the top-level arguments of the call whose '(' is at `open_at`."""
    close = _close_paren(code, open_at)
    if close is None:
        return None
    spans, depth, start = [], 0, open_at + 1
    for i in range(open_at + 1, close):
        ch = code[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            spans.append((start, i))
            start = i + 1
    spans.append((start, close))
    return spans


def _paren_after(code: str, pos: int) -> int | None:
    m = re.compile(r"\s*\(").match(code, pos)
    return m.end() - 1 if m else None


def _include(text: str, f: Finding) -> Edit | None:
    headers = f.rule.fix if isinstance(f.rule.fix, tuple) else None
    if not headers:
        return None
    line_end = text.find("\n", f.start)
    line_end = len(text) if line_end < 0 else line_end
    lines = "\n".join(f"#include <{h}>" for h in headers)
    return Edit(f.start, line_end, lines)


def _dispatch(text: str, code: str, f: Finding, rename: dict[str, str]) -> list[Edit]:
    """AT_DISPATCH_X(TYPE, NAME, BODY) and its _AND forms -> THO_DISPATCH_V2(TYPE, NAME, AT_WRAP(BODY),
    TYPES), as three small edits so that fixes inside TYPE, NAME and BODY still apply."""
    types = f.rule.dispatch_v2
    open_at = _paren_after(code, f.end)
    if types is None or open_at is None:
        return []
    args = _arguments(code, open_at)
    extra = [t for t in types if t.startswith("$")]
    if args is None or len(args) != 3 + len(extra):
        return []
    given = [_renamed(text[s:e].strip(), rename) for s, e in args[: len(extra)]]
    resolved = [given[int(t[1:]) - 1] if t.startswith("$") else t for t in types]
    body_start, close = args[-1][0], args[-1][1]
    body_start += len(text[body_start:close]) - len(text[body_start:close].lstrip())
    return [
        Edit(f.start, args[len(extra)][0], "THO_DISPATCH_V2("),
        Edit(body_start, body_start, "AT_WRAP("),
        Edit(close, close + 1, f"), {', '.join(resolved)})"),
    ]


def _renamed(snippet: str, rename: dict[str, str]) -> str:
    """A moved argument with the name substitutions --fix makes elsewhere (at::kHalf -> ...)."""

    def one(m: re.Match[str]) -> str:
        name = re.sub(r"\s+", "", m.group(0))
        for n in range(name.count("::") + 1, 0, -1):
            prefix = "::".join(name.split("::")[:n])
            if prefix in rename:
                return rename[prefix] + name[len(prefix) :]
        return m.group(0)

    return re.sub(r"(?<![\w:])(?:at|c10|torch)(?:\s*::\s*\w+)+", one, snippet)


def _method(text: str, code: str, f: Finding) -> list[Edit]:
    """`t.contiguous()` -> `torch::stable::contiguous(t)`; `t.data_ptr<T>()` -> `t.mutable_data_ptr<T>()`."""
    fix = f.rule.fix
    if not isinstance(fix, str):
        return []
    receiver, _, method = f.what.partition(".")
    if "::" not in fix:  # a renamed member
        return [Edit(f.end - len(method), f.end, fix)]
    open_at = _paren_after(code, f.end)
    args = _arguments(code, open_at) if open_at is not None else None
    if open_at is None or args is None:
        return []
    empty = len(args) == 1 and not text[args[0][0] : args[0][1]].strip()
    return [Edit(f.start, open_at + 1, f"{fix}({receiver}" + ("" if empty else ", "))]


def _box_impls(text: str, code: str, f: Finding) -> list[Edit]:
    """Inside a TORCH_LIBRARY(_IMPL/_FRAGMENT) block: `m.impl("op", fn)` -> `m.impl("op", TORCH_BOX(fn))`."""
    open_at = _paren_after(code, f.end)
    close = _close_paren(code, open_at) if open_at is not None else None
    brace = code.find("{", close) if close is not None else -1
    if brace < 0 or code[close + 1 : brace].strip():  # type: ignore[operator]
        return []
    depth, end = 0, len(code)
    for i in range(brace, len(code)):
        depth += (code[i] == "{") - (code[i] == "}")
        if depth == 0:
            end = i
            break
    edits = []
    for m in _IMPL.finditer(code, brace, end):
        args = _arguments(code, m.end() - 1)
        if args and len(args) == 2 and "TORCH_BOX" not in code[args[1][0] : args[1][1]]:
            s, e = args[1]
            piece = text[s:e]
            first, last = s + len(piece) - len(piece.lstrip()), s + len(piece.rstrip())
            edits += [Edit(first, first, "TORCH_BOX("), Edit(last, last, ")")]
    return edits


def edits_for(text: str, findings: list[Finding], rename: dict[str, str]) -> tuple[list[Edit], list[Finding]]:
    """The mechanical edits of one file, and the findings left for a hand change. `rename` maps
    each unstable name with a mechanical fix to its replacement."""
    code = mask(text)
    edits: list[Edit] = []
    left: list[Finding] = []
    for f in findings:
        made: list[Edit] = []
        if f.rule.fix is None and f.rule.dispatch_v2 is None:
            pass
        elif f.kind == "include":
            made = [e for e in [_include(text, f)] if e]
        elif f.rule.dispatch_v2 is not None:
            made = _dispatch(text, code, f, rename)
        elif f.kind == "method":
            made = _method(text, code, f)
        elif isinstance(f.rule.fix, str):
            made = [Edit(f.start, f.end, f.rule.fix)]
            if f.kind == "macro" and f.what.startswith("TORCH_LIBRARY"):
                made += _box_impls(text, code, f)
        if made:
            edits.extend(made)
        else:
            left.append(f)
    return edits, left


def apply(text: str, edits: list[Edit]) -> str:
    """`text` with the edits applied; an edit overlapping an earlier one is dropped (the edits of
    one run never overlap: constructs that contain others are rewritten by small edits around them)."""
    out, pos = [], 0
    for e in sorted(edits, key=lambda e: (e.start, e.end)):
        if e.start < pos:
            continue
        out.append(text[pos : e.start])
        out.append(e.text)
        pos = e.end
    out.append(text[pos:])
    return "".join(out)


def unified_diff(path: str, before: str, after: str) -> str:
    """A `git apply` / `patch -p1` compatible diff of one file."""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{path}", f"b/{path}"
    )
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
