"""One source file: its unstable uses (findings), its stable uses (which set the TORCH_TARGET_VERSION
it needs) and its includes. Every matcher runs over the blanked code (lexer.mask) with disabled
branches and directive lines blanked too, so comments, strings and `#if 0` code never match."""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

from .knowledge import BASELINE, Api, Knowledge, Rule, Version
from .lexer import LineIndex, directives, mask
from .preproc import Regions, regions

# Each matcher starts with literal text, which the regex engine finds fast; what must come before a
# match (not an identifier character, not `.`/`->`/`::`) is checked on the few hits (_free_before).
_QUALIFIED = re.compile(r"(?:at|c10|torch|caffe2)::(?:\s*~?[A-Za-z_]\w*\s*::)*\s*~?[A-Za-z_]\w*")
_MACRO_LIKE = re.compile(r"(?:TORCH_|AT_|C10_|PYBIND11_|STABLE_|STD_|THO_|aoti_torch_|torch_)\w*")
_INCLUDE = re.compile(r"\s*([<\"])([^>\"\n]+)[>\"]")
_DEFINE_HEAD = re.compile(r"\s*([A-Za-z_]\w*)(\([^)\n]*\))?")
_USING_NS = re.compile(r"using\s+namespace\s+(?:::\s*)?(at|torch|c10)\s*;")
_USING_DECL = re.compile(r"using\s+(?:::\s*)?(at|torch|c10)\s*::\s*([A-Za-z_]\w*)\s*;")
_TENSOR_ALIAS = re.compile(r"using\s+Tensor\s*=\s*(?:::\s*)?(?:at|torch)\s*::\s*Tensor\b")
_TENSOR = re.compile(r"Tensor\b")
_DECLARATOR = re.compile(r"\s*(?:const\b\s*)?[&*]{0,2}\s*(?:const\b\s*)?([A-Za-z_]\w*)\s*(?=[,)=;{\[(])")
_QUALIFIER = re.compile(r"(\w+)\s*::\s*$")
_STABLE_TENSOR_IN_SCOPE = re.compile(
    r"using\s+(?:::\s*)?torch\s*::\s*stable\s*::\s*Tensor\s*;|using\s+namespace\s+(?:::\s*)?torch\s*::\s*stable\s*;"
    r"|using\s+Tensor\s*=\s*(?:::\s*)?torch\s*::\s*stable\s*::\s*Tensor\b"
)
_UNSTABLE_NS = re.compile(r"using\s+namespace\s+(?:::\s*)?(?:at|torch)\s*;")
_USING_TENSOR = re.compile(r"using\s+(?:::\s*)?(?:at|torch)\s*::\s*Tensor\s*;")
_KEYWORDS = frozenset(
    {"const", "operator", "return", "else", "case", "throw", "delete", "new", "goto", "co_return", "sizeof"}
)
_NOT_TYPES = frozenset({"typename", "class", "struct", "using", "namespace", "template", "decltype"})
_NOT_NEWLINE = re.compile(r"[^\n]")


def _free_before(code: str, start: int, member: bool = True) -> bool:
    """No identifier character before `start`, nor `::` of an enclosing name, nor (with `member`)
    the `.` or `->` of a member access."""
    if start == 0:
        return True
    ch = code[start - 1]
    if ch.isalnum() or ch in "_$":
        return False
    if ch == ":" and start >= 2 and code[start - 2] == ":":  # `::at::X` is global; `ns::at::X` is not torch
        return start < 3 or not (code[start - 3].isalnum() or code[start - 3] in "_>")
    if member and (ch == "." or (ch == ">" and start >= 2 and code[start - 2] == "-")):
        return False
    return True


@dataclass(frozen=True)
class Finding:
    """One unstable use: where, what it is, the rule that replaces it, and its span in the file."""

    line: int
    col: int
    kind: str  # include, name, macro, method
    what: str
    rule: Rule
    start: int
    end: int


@dataclass
class Include:
    header: str
    quoted: bool
    line: int


@dataclass
class FileScan:
    """What one file holds: findings in source order, stable uses by name (with what they need),
    includes, macros it defines."""

    findings: list[Finding] = field(default_factory=list)
    uses: dict[str, Api] = field(default_factory=dict)
    includes: list[Include] = field(default_factory=list)
    defines: set[str] = field(default_factory=set)
    torch: bool = False  # the file touches torch at all (stable or not)

    def target(self) -> Version | None:
        """The TORCH_TARGET_VERSION this file alone needs (None: no torch API used)."""
        if not self.torch:
            return None
        found = [a.target for a in self.uses.values() if a.target]
        found += [f.rule.target for f in self.findings if f.rule.target]
        return max([BASELINE, *found])

    def build(self) -> Version | None:
        """The oldest torch whose headers have every stable API used and every replacement named."""
        if not self.torch:
            return None
        found = [a.since for a in self.uses.values()] + [f.rule.since for f in self.findings if f.rule.since]
        return max([BASELINE, *found])


def _blank(text: str, start: int, end: int) -> str:
    return _NOT_NEWLINE.sub(" ", text[start:end])


def code_of(masked: str, spans: Regions) -> tuple[str, list[tuple[str, int, int, int]]]:
    """The code to match: disabled branches and directives blanked, `#define` bodies kept (a macro
    body is code wherever the macro is used). Also each directive as (name, start, rest_start, end)."""
    pieces: list[str] = []
    pos = 0
    cuts: list[tuple[int, int]] = list(spans.disabled)
    found: list[tuple[str, int, int, int]] = []
    for d in directives(masked):
        found.append((d.name, d.start, d.rest_start, d.end))
        head_end = d.end
        if d.name == "define":
            m = _DEFINE_HEAD.match(masked, d.rest_start)
            head_end = m.end() if m else d.end
        cuts.append((d.start, head_end))
    for start, end in sorted(cuts):
        if end <= pos:
            continue
        start = max(start, pos)
        pieces.append(masked[pos:start])
        pieces.append(_blank(masked, start, end))
        pos = end
    pieces.append(masked[pos:])
    return "".join(pieces), found


class _Guards:
    """The feature-version guard at an offset (the highest of the enclosing guarded branches)."""

    def __init__(self, spans: Regions) -> None:
        self.spans = spans.guarded

    def at(self, offset: int) -> Version | None:
        best: Version | None = None
        for start, end, version in self.spans:
            if start <= offset < end and (best is None or version > best):
                best = version
        return best


class Scanner:
    """Scans files with one Knowledge; the compiled matchers are built once."""

    def __init__(self, know: Knowledge) -> None:
        self.know = know
        self._guarded_members = {
            m: know.api[f"torch::stable::Tensor::{m}"]
            for m in know.tensor_members
            if f"torch::stable::Tensor::{m}" in know.api and know.api[f"torch::stable::Tensor::{m}"].target
        }
        self._members = re.compile("|".join(sorted(self._guarded_members, key=len, reverse=True)) + r"(?=\s*[<(])")
        self._unqualified: dict[str, dict[str, str]] = {}
        for key in know.names:
            ns, _, rest = key.partition("::")
            if rest and "::" not in rest and (rest[0].isupper() or re.match(r"k[A-Z]", rest)):
                self._unqualified.setdefault(ns, {})[rest] = key
        factories = "|".join(map(re.escape, sorted(know.factories)))
        self._factory = re.compile(
            r"auto\s*&{0,2}\s*([A-Za-z_]\w*)\s*=\s*(?:::\s*)?(?:at|torch)\s*::\s*(?:" + factories + r")\s*\("
        )

    def scan(self, text: str, project_macros: frozenset[str] = frozenset()) -> FileScan:
        """Everything the inventory reads from one file's text."""
        masked = mask(text)
        spans = regions(directives(masked), len(masked))
        code, dirs = code_of(masked, spans)
        lines = LineIndex(text)
        guards = _Guards(spans)
        out = FileScan()
        self._directives(text, dirs, spans, lines, out)
        self._qualified(code, lines, guards, out)
        self._identifiers(code, lines, guards, out, project_macros)
        self._unqualified_names(code, lines, out)
        self._methods(code, lines, guards, out)
        out.findings.sort(key=lambda f: (f.line, f.col))
        out.torch = out.torch or bool(out.findings or out.uses)
        return out

    def _directives(
        self, text: str, dirs: list[tuple[str, int, int, int]], spans: Regions, lines: LineIndex, out: FileScan
    ) -> None:
        disabled = spans.disabled
        for name, start, rest_start, end in dirs:
            if any(s <= start < e for s, e in disabled):
                continue
            if name == "define":
                m = _DEFINE_HEAD.match(text, rest_start)
                if m:
                    out.defines.add(m.group(1))
            if name not in ("include", "include_next", "import"):
                continue
            m = _INCLUDE.match(text, rest_start)
            if not m:
                continue
            header = m.group(2).strip()
            line, col = lines.position(start)
            out.includes.append(Include(header, m.group(1) == '"', line))
            api = self.know.api.get(header)
            if api is not None:
                out.uses[header] = api
                continue
            rule = self.know.include_rule(header)
            if rule is not None:
                what = f"#include {m.group(1)}{header}{'>' if m.group(1) == '<' else chr(34)}"
                out.findings.append(Finding(line, col, "include", what, rule, start, end))

    def _qualified(self, code: str, lines: LineIndex, guards: _Guards, out: FileScan) -> None:
        for m in _QUALIFIED.finditer(code):
            if not _free_before(code, m.start()):
                continue
            name = re.sub(r"\s+", "", m.group())
            if name.startswith(("torch::stable::", "torch::headeronly::")):
                self._use(name, self.know.stable_api(name), guards.at(m.start()), out)
                continue
            if self.know.is_header_only(name):
                out.torch = True
                continue
            found = self.know.name_rule(name)
            if found is None:
                continue
            rule, prefix = found
            end = m.start() + _span_of(code, m.start(), prefix)
            line, col = lines.position(m.start())
            out.findings.append(Finding(line, col, "name", name, rule, m.start(), end))

    def _use(self, name: str, api: Api | None, guard: Version | None, out: FileScan) -> None:
        """Record a stable use; one under a feature guard at least as new as it needs adds nothing."""
        out.torch = True
        if api is None:
            return
        if api.target is not None and guard is not None and api.target <= guard:
            api = Api(api.since, None)
        known = out.uses.get(name)
        if known is None or (api.target or BASELINE) > (known.target or BASELINE):
            out.uses[name] = api

    def _identifiers(
        self, code: str, lines: LineIndex, guards: _Guards, out: FileScan, project_macros: frozenset[str]
    ) -> None:
        """Unstable macros (TORCH_CHECK, AT_DISPATCH_*, ...) and stable macros and shim functions."""
        for m in _MACRO_LIKE.finditer(code):
            name = m.group()
            if not _free_before(code, m.start()):
                continue
            api = self.know.api.get(name)
            if api is not None:
                self._use(name, api, guards.at(m.start()), out)
                continue
            rule = self.know.macros.get(name)
            if rule is None:
                rule = next((r for p, r in self.know.macro_prefixes.items() if name.startswith(p)), None)
            if rule is None or name in project_macros or name in out.defines:
                continue  # not torch's, or the project's own macro of that name (its body is scanned)
            line, col = lines.position(m.start())
            out.findings.append(Finding(line, col, "macro", name, rule, m.start(), m.end()))
        if self._guarded_members:
            for m in self._members.finditer(code):
                i = m.start() - 1
                while i >= 0 and code[i].isspace():
                    i -= 1
                if i >= 0 and code[i] in ".>":
                    api = self._guarded_members[m.group()]
                    self._use(f"torch::stable::Tensor::{m.group()}", api, guards.at(m.start()), out)

    def _unqualified_names(self, code: str, lines: LineIndex, out: FileScan) -> None:
        """Type names and constants used without qualification after `using namespace at;` (or
        `using at::Tensor;`)."""
        wanted: dict[str, str] = {}
        for m in _USING_NS.finditer(code):
            wanted.update(self._unqualified.get(m.group(1), {}))
        for m in _USING_DECL.finditer(code):
            key = f"{m.group(1)}::{m.group(2)}"
            if key in self.know.names:
                wanted[m.group(2)] = key
        if not wanted:
            return
        pattern = re.compile(
            r"(?<![\w:.$>])(" + "|".join(map(re.escape, sorted(wanted, key=len, reverse=True))) + r")(?![\w$])"
        )
        for m in pattern.finditer(code):
            if re.search(r"\b(?:using|struct|class|enum)\s+$", code[max(0, m.start() - 12) : m.start()]):
                continue  # declares that name (an alias, a type of the project's own)
            key = wanted[m.group(1)]
            line, col = lines.position(m.start(1))
            out.findings.append(Finding(line, col, "name", key, self.know.names[key], m.start(1), m.end(1)))

    def _methods(self, code: str, lines: LineIndex, guards: _Guards, out: FileScan) -> None:
        """Members that torch::stable::Tensor lacks, called on a variable whose nearest declaration
        before the call makes it a tensor: at::Tensor, torch::Tensor, Tensor after `using namespace
        at;`, `auto x = at::empty(...)` (unstable), or torch::stable::Tensor (a call that would not
        compile once migrated)."""
        bare = None
        if "using" in code:
            if _STABLE_TENSOR_IN_SCOPE.search(code):
                bare = "stable"
            elif _UNSTABLE_NS.search(code) or _TENSOR_ALIAS.search(code) or _USING_TENSOR.search(code):
                bare = "unstable"
        decls = _tensor_declarations(code, bare)
        decls += [
            (m.start(), m.group(1), "unstable") for m in self._factory.finditer(code) if _free_before(code, m.start())
        ]
        tensors = {name for _, name, kind in decls if kind} - _KEYWORDS
        if not tensors:
            return
        receivers = "|".join(map(re.escape, sorted(tensors, key=len, reverse=True)))
        declared = _Declarations(code, receivers, decls)
        call = re.compile(r"(" + receivers + r")\s*(?:\.|->)\s*([A-Za-z_]\w*)\s*(<[^;{}()]*?>\s*)?\(")
        for m in call.finditer(code):
            if not _free_before(code, m.start()) or not declared.is_tensor(m.group(1), m.start()):
                continue
            method, template = m.group(2), m.group(3)
            rule = self.know.methods.get(method + "<") if template else None
            if rule is None:
                if method in self.know.tensor_members:
                    continue
                rule = self.know.methods.get(method) or self.know.methods["*"]
            line, col = lines.position(m.start(1))
            out.findings.append(Finding(line, col, "method", f"{m.group(1)}.{method}", rule, m.start(1), m.end(2)))


def _tensor_declarations(code: str, bare: str | None) -> list[tuple[int, str, str | None]]:
    """(offset, name, kind) of every `Tensor NAME` declarator: "unstable" for at::Tensor and
    torch::Tensor, "stable" for torch::stable::Tensor, `bare`'s kind for an unqualified Tensor."""
    out: list[tuple[int, str, str | None]] = []
    for m in _TENSOR.finditer(code):
        if m.start() and (code[m.start() - 1].isalnum() or code[m.start() - 1] in "_$"):
            continue
        decl = _DECLARATOR.match(code, m.end())
        if decl is None:
            continue
        qualifier = _QUALIFIER.search(code, max(0, m.start() - 24), m.start())
        if qualifier is None:
            kind = bare
        else:
            kind = {"at": "unstable", "torch": "unstable", "stable": "stable"}.get(qualifier.group(1))
        out.append((m.start(), decl.group(1), kind))
    return out


class _Declarations:
    """Declarations of some names in a file, in order: which are unstable tensors. A declaration of
    another type (`vec_op::INT8Vec64 data(...)`) shadows a tensor of that name from there on."""

    def __init__(self, code: str, names: str, tensors: list[tuple[int, str, str | None]]) -> None:
        self.by_name: dict[str, list[tuple[int, str]]] = {}
        for offset, name, kind in tensors:
            self.by_name.setdefault(name, []).append((offset, kind or ""))
        for m in re.finditer(r"(?:" + names + r")(?=\s*[,)=;{\[(:])", code):
            if not _free_before(code, m.start()) or (m.end() < len(code) and code[m.end()].isalnum()):
                continue
            word = _type_before(code, m.start())
            if word and word not in _KEYWORDS and word not in _NOT_TYPES and word not in ("Tensor", "auto"):
                self.by_name.setdefault(m.group(), []).append((m.start(), ""))
        for entries in self.by_name.values():
            entries.sort()

    def is_tensor(self, name: str, offset: int) -> bool:
        """Whether the nearest declaration of `name` before `offset` (else the first one) is a tensor."""
        entries = self.by_name.get(name, [])
        if not entries:
            return False
        i = bisect.bisect_right(entries, (offset, "~")) - 1
        return bool(entries[max(i, 0)][1])


def _type_before(code: str, pos: int) -> str | None:
    """The word (or '>') a declarator at `pos` follows, past `&`, `*` and `const`; None when the
    token before is anything else (an operator, a comma: not a declaration)."""
    i = pos - 1
    while True:
        while i >= 0 and (code[i].isspace() or code[i] in "&*"):
            i -= 1
        if i < 0:
            return None
        if code[i] == ">":
            return ">"
        j = i
        while j >= 0 and (code[j].isalnum() or code[j] == "_"):
            j -= 1
        word = code[j + 1 : i + 1]
        if word == "const":
            i = j
            continue
        return word or None


def _span_of(code: str, start: int, prefix: str) -> int:
    """Length in `code` (spaces allowed around `::`) of the text that spells `prefix` from `start`."""
    i, j = start, 0
    while j < len(prefix) and i < len(code):
        if code[i] == prefix[j]:
            i, j = i + 1, j + 1
        elif code[i].isspace():
            i += 1
        else:
            break
    return i - start
