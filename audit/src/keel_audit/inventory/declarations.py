"""What one torch header declares for extension authors: macros, namespace-scope names (types,
aliases, functions, constants, re-exports), class members, and C shim functions, each with the
feature-version guard it sits under. The stable-API table generator runs this over the headers of
every torch release; the tests run it over the installed torch."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .lexer import directives, mask
from .preproc import Version, regions

_WORD = re.compile(r"[A-Za-z_]\w*|[0-9]\w*|::|->|&&|[{}();<>,=*&~:\[\]]")
_KEYWORDS = frozenset(
    """alignas alignof asm auto bool break case catch char class const constexpr consteval constinit
    const_cast continue decltype default delete do double dynamic_cast else enum explicit export extern
    false float for friend goto if inline int long mutable namespace new noexcept nullptr operator private
    protected public register reinterpret_cast requires return short signed sizeof static static_assert
    static_cast struct switch template this throw true try typedef typeid typename union unsigned using
    virtual void volatile while final override""".split()
)
_TYPE_KEYS = frozenset({"class", "struct", "union", "enum"})
_SHIM_EXPORT = "AOTI_TORCH_EXPORT"


@dataclass
class Declarations:
    """Names one header declares -> the guard version they sit under (None: unguarded)."""

    macros: dict[str, Version | None] = field(default_factory=dict)
    names: dict[str, Version | None] = field(default_factory=dict)
    shim: dict[str, Version | None] = field(default_factory=dict)


@dataclass
class _Scope:
    kind: str  # "ns", "class", "other"
    name: str


def _guard_at(guarded: list[tuple[int, int, Version]], offset: int) -> Version | None:
    best: Version | None = None
    for start, end, version in guarded:
        if start <= offset < end and (best is None or version > best):
            best = version
    return best


def _blank_directives(masked: str) -> str:
    """The blanked text with every directive line blanked too (newlines kept)."""
    parts: list[str] = []
    pos = 0
    for d in directives(masked):
        parts.append(masked[pos : d.start])
        parts.append(re.sub(r"[^\n]", " ", masked[d.start : d.end]))
        pos = d.end
    parts.append(masked[pos:])
    return "".join(parts)


def declarations(text: str) -> Declarations:
    """Everything `text` (one header) declares that an extension can use, with its guard."""
    masked = mask(text)
    spans = regions(directives(masked), len(masked))
    out = Declarations()
    disabled = spans.disabled
    skipped = sorted(disabled + spans.alternative)
    for d in directives(masked):
        if d.name == "define" and not any(s <= d.start < e for s, e in disabled):
            m = re.match(r"\s*([A-Za-z_]\w*)", d.rest)
            if m and not m.group(1).startswith("_") and not re.search(r"_H_?$", m.group(1)):
                out.macros.setdefault(m.group(1), _guard_at(spans.guarded, d.start))
    code = _blank_directives(masked)
    tokens = [(m.group(), m.start()) for m in _WORD.finditer(code) if not any(s <= m.start() < e for s, e in skipped)]
    _walk(tokens, spans.guarded, out)
    return out


def _walk(tokens: list[tuple[str, int]], guarded: list[tuple[int, int, Version]], out: Declarations) -> None:
    """One pass over the code tokens, keeping a stack of namespaces, classes and other braces."""
    scopes: list[_Scope] = []
    parens = 0
    pending: _Scope | None = None  # the scope the next '{' opens
    i = 0
    while i < len(tokens):
        tok, offset = tokens[i]
        prev = tokens[i - 1][0] if i else ""
        nxt = tokens[i + 1][0] if i + 1 < len(tokens) else ""
        if tok == "(":
            parens += 1
        elif tok == ")":
            parens = max(parens - 1, 0)
        elif parens:
            pass
        elif tok in ("HIDDEN_NAMESPACE_BEGIN", "HIDDEN_NAMESPACE_END"):
            j = i + 2
            names: list[str] = []
            while j < len(tokens) and tokens[j][0] != ")":
                if tokens[j][0] != ",":
                    names.append(tokens[j][0])
                j += 1
            if tok.endswith("BEGIN"):
                scopes.append(_Scope("ns", "::".join(names)))
            elif scopes:
                scopes.pop()
            i = j + 1
            continue
        elif tok == "extern" and nxt == "{":
            pending = _Scope("extern", "")
        elif tok == "namespace" and nxt not in ("=",):
            j, parts = i + 1, []
            while j < len(tokens) and tokens[j][0] not in ("{", ";", "="):
                if tokens[j][0] not in ("::", "inline"):
                    parts.append(tokens[j][0])
                j += 1
            pending = _Scope("ns", "::".join(parts))
            i = j
            continue
        elif tok in _TYPE_KEYS and prev not in ("enum", "<", ",", "friend") and _scope_kind(scopes) in ("ns", "class"):
            name = _type_name(tokens, i)
            if name:
                _record(out.names, scopes, name, guarded, offset)
                pending = _Scope("class", name)
        elif tok == "using" and _scope_kind(scopes) in ("ns", "class"):
            i = _using(tokens, i, scopes, guarded, out)
            continue
        elif tok == "{":
            scopes.append(pending or _Scope("other", ""))
            pending = None
        elif tok == "}":
            if scopes:
                scopes.pop()
        elif tok == ";":
            pending = None
        elif _is_declarator(tok, prev, nxt, scopes):
            if prev == _SHIM_EXPORT or _exported(tokens, i):
                out.shim.setdefault(tok, _guard_at(guarded, offset))
            else:
                _record(out.names, scopes, tok, guarded, offset)
        i += 1


def _scope_kind(scopes: list[_Scope]) -> str:
    scopes = [s for s in scopes if s.kind != "extern"]
    if not scopes:
        return "ns"
    if any(s.kind == "other" or (s.kind == "ns" and s.name == "") for s in scopes):
        return "other"
    return scopes[-1].kind


def _qualified(scopes: list[_Scope], name: str) -> str:
    return "::".join([s.name for s in scopes if s.name] + [name])


_Guarded = list[tuple[int, int, Version]]


def _record(table: dict[str, Version | None], scopes: list[_Scope], name: str, guarded: _Guarded, offset: int) -> None:
    if _scope_kind(scopes) == "other" or name in _KEYWORDS or name.startswith("_"):
        return
    table.setdefault(_qualified(scopes, name), _guard_at(guarded, offset))


def _type_name(tokens: list[tuple[str, int]], i: int) -> str | None:
    """The name declared by `class|struct|union|enum [class] [attrs] NAME ...` at token i."""
    j = i + 1
    if j < len(tokens) and tokens[j][0] in ("class", "struct"):
        j += 1
    while j < len(tokens):
        tok = tokens[j][0]
        if tok == "alignas":
            j += 4  # alignas ( N )
            continue
        if re.match(r"[A-Za-z_]\w*$", tok) and tok not in _KEYWORDS:
            after = tokens[j + 1][0] if j + 1 < len(tokens) else ""
            if after in ("{", ":", ";", "final") or (after and re.match(r"[A-Za-z_]", after) is None and after != "<"):
                return tok if after != "(" else None
            if re.match(r"[A-Z0-9_]+$", tok):  # an attribute macro (C10_API ...)
                j += 1
                continue
            return tok if after in ("{", ":", ";", "final") else None
        return None
    return None


def _using(tokens: list[tuple[str, int]], i: int, scopes: list[_Scope], guarded: _Guarded, out: Declarations) -> int:
    """`using NAME = ...;` declares NAME; `using a::b::NAME;` re-exports NAME here."""
    j = i + 1
    words: list[str] = []
    while j < len(tokens) and tokens[j][0] not in (";", "{", "}"):
        words.append(tokens[j][0])
        j += 1
    offset = tokens[i][1]
    if len(words) >= 2 and words[1] == "=":
        _record(out.names, scopes, words[0], guarded, offset)
    elif (
        words and words[0] not in ("namespace", "typename") and "::" in words and re.match(r"[A-Za-z_]\w*$", words[-1])
    ):
        _record(out.names, scopes, words[-1], guarded, offset)
    return j


def _is_declarator(tok: str, prev: str, nxt: str, scopes: list[_Scope]) -> bool:
    """A function or variable name at namespace or class scope: an identifier after a type-like
    token and before '(' (a function) or '=' / '{' of a constant."""
    if nxt not in ("(", "=", "{") or not re.match(r"[A-Za-z_]\w*$", tok) or tok in _KEYWORDS:
        return False
    if _scope_kind(scopes) not in ("ns", "class"):
        return False
    if scopes and scopes[-1].kind == "class" and tok == scopes[-1].name:
        return False  # a constructor
    if nxt == "(" and re.match(r"[A-Z][A-Z0-9_]+$", tok) and prev in ("", ";", "}", "{"):
        return False  # a macro invocation at namespace scope
    return prev in ("*", "&", "&&", ">") or (
        re.match(r"[A-Za-z_]\w*$", prev) is not None and prev not in ("return", "new", "case", "goto", "else", "do")
    )


def _exported(tokens: list[tuple[str, int]], i: int) -> bool:
    """A C shim declaration: AOTI_TORCH_EXPORT within the few tokens before the name."""
    return any(tokens[j][0] == _SHIM_EXPORT for j in range(max(0, i - 4), i))
