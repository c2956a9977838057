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

_QUALIFIED = re.compile(r"(?<![\w:.$])(?:::\s*)?((?:at|c10|torch|caffe2)(?:\s*::\s*~?[A-Za-z_]\w*)+)")
_STABLE_IDENT = re.compile(
    r"(?<![\w$.:])((?:STABLE_|STD_|THO_)\w+|TORCH_BOX|TORCH_ERROR_CODE_CHECK|TORCH_DYNAMIC_VERSION_CALL\w*"
    r"|aoti_torch_\w+|torch_\w+)(?![\w$])"
)
_MEMBER_CALL = re.compile(r"[.>]\s*([A-Za-z_]\w*)\s*[<(]")
_INCLUDE = re.compile(r"\s*([<\"])([^>\"\n]+)[>\"]")
_DEFINE_HEAD = re.compile(r"\s*([A-Za-z_]\w*)(\([^)\n]*\))?")
_USING_NS = re.compile(r"\busing\s+namespace\s+(?:::\s*)?(at|torch|c10)\s*;")
_USING_DECL = re.compile(r"\busing\s+(?:::\s*)?(at|torch|c10)\s*::\s*([A-Za-z_]\w*)\s*;")
_TENSOR_ALIAS = re.compile(r"\busing\s+Tensor\s*=\s*(?:::\s*)?(?:at|torch)\s*::\s*Tensor\b")
_TENSOR_DECL = re.compile(
    r"(?<![\w:])((?:(?:at|torch)\s*::\s*)?)Tensor\s*(?:const\b\s*)?[&*]{0,2}\s*(?:const\b\s*)?([A-Za-z_]\w*)\s*(?=[,)=;{\[(])"
)
_USING_TENSOR = re.compile(r"\busing\s+(?:::\s*)?(?:at|torch)\s*::\s*Tensor\s*;")
_KEYWORDS = frozenset(
    {"const", "operator", "return", "else", "case", "throw", "delete", "new", "goto", "co_return", "sizeof"}
)
_NOT_TYPES = frozenset({"typename", "class", "struct", "using", "namespace", "template", "decltype"})
_NOT_NEWLINE = re.compile(r"[^\n]")


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
        exact = sorted(know.macros, key=len, reverse=True)
        prefixes = [re.escape(p) + r"\w+" for p in know.macro_prefixes]
        self._macro = re.compile(r"(?<![\w$])(" + "|".join([*map(re.escape, exact), *prefixes]) + r")(?![\w$])")
        self._guarded_members = {
            m: know.api[f"torch::stable::Tensor::{m}"]
            for m in know.tensor_members
            if f"torch::stable::Tensor::{m}" in know.api and know.api[f"torch::stable::Tensor::{m}"].target
        }
        self._unqualified: dict[str, dict[str, str]] = {}
        for key in know.names:
            ns, _, rest = key.partition("::")
            if rest and "::" not in rest and (rest[0].isupper() or re.match(r"k[A-Z]", rest)):
                self._unqualified.setdefault(ns, {})[rest] = key
        factories = "|".join(map(re.escape, sorted(know.factories)))
        self._factory = re.compile(
            r"\bauto\s*&{0,2}\s*([A-Za-z_]\w*)\s*=\s*(?:::\s*)?(?:at|torch)\s*::\s*(?:" + factories + r")\s*\("
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
        self._macros(code, lines, out, project_macros)
        self._stable_idents(code, guards, out)
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
            name = re.sub(r"\s+", "", m.group(1))
            root = name.split("::", 1)[0]
            if name.startswith(("torch::stable::", "torch::headeronly::")):
                self._use(name, self.know.stable_api(name), guards.at(m.start()), out)
                continue
            if self.know.is_header_only(name):
                out.torch = True
                continue
            found = self.know.name_rule(name)
            if found is None or root not in ("at", "c10", "torch", "caffe2"):
                continue
            rule, prefix = found
            end = m.start(1) + _span_of(code, m.start(1), prefix)
            line, col = lines.position(m.start(1))
            out.findings.append(Finding(line, col, "name", name, rule, m.start(1), end))

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

    def _macros(self, code: str, lines: LineIndex, out: FileScan, project_macros: frozenset[str]) -> None:
        for m in self._macro.finditer(code):
            name = m.group(1)
            if name in project_macros or name in out.defines:
                continue  # the project's own macro of that name: its body is scanned where it is defined
            rule = self.know.macros.get(name)
            if rule is None:
                rule = next(r for p, r in self.know.macro_prefixes.items() if name.startswith(p))
            line, col = lines.position(m.start(1))
            out.findings.append(Finding(line, col, "macro", name, rule, m.start(1), m.end(1)))

    def _stable_idents(self, code: str, guards: _Guards, out: FileScan) -> None:
        for m in _STABLE_IDENT.finditer(code):
            api = self.know.api.get(m.group(1))
            if api is not None:
                self._use(m.group(1), api, guards.at(m.start()), out)
        if self._guarded_members:
            for m in _MEMBER_CALL.finditer(code):
                api = self._guarded_members.get(m.group(1))
                if api is not None:
                    self._use(f"torch::stable::Tensor::{m.group(1)}", api, guards.at(m.start()), out)

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
        """Members of at::Tensor that torch::stable::Tensor lacks, called on a variable whose nearest
        declaration before the call gives it an unstable tensor type (at::Tensor, torch::Tensor, or
        Tensor after `using namespace at;`, or `auto x = at::empty(...)`)."""
        unqualified = bool(re.search(r"\busing\s+namespace\s+(?:::\s*)?(?:at|torch)\s*;", code))
        unqualified = unqualified or bool(_TENSOR_ALIAS.search(code) or _USING_TENSOR.search(code))
        tensors = {m.group(2) for m in _TENSOR_DECL.finditer(code) if m.group(1) or unqualified}
        tensors |= {m.group(1) for m in self._factory.finditer(code)}
        tensors -= _KEYWORDS
        if not tensors:
            return
        receivers = "|".join(map(re.escape, sorted(tensors, key=len, reverse=True)))
        declared = _Declarations(code, receivers, unqualified, self._factory)
        call = re.compile(r"(?<![\w$.>])(" + receivers + r")\s*(?:\.|->)\s*([A-Za-z_]\w*)\s*(<[^;{}()]*?>\s*)?\(")
        for m in call.finditer(code):
            if not declared.is_tensor(m.group(1), m.start()):
                continue
            method, template = m.group(2), m.group(3)
            rule = self.know.methods.get(method + "<") if template else None
            if rule is None:
                if method in self.know.tensor_members:
                    continue
                rule = self.know.methods.get(method) or self.know.methods["*"]
            line, col = lines.position(m.start(1))
            out.findings.append(Finding(line, col, "method", f"{m.group(1)}.{method}", rule, m.start(1), m.end(2)))


class _Declarations:
    """Declarations of some names in a file, in order: which are unstable tensors."""

    def __init__(self, code: str, names: str, unqualified: bool, factory: re.Pattern[str]) -> None:
        pattern = re.compile(
            r"(?:\b([A-Za-z_]\w*)|(>))\s*(?:const\b\s*)?[&*]{0,2}\s*(?:const\b\s*)?(?<![\w$])("
            + names
            + r")\s*(?=[,)=;{\[(:])"
        )
        self.by_name: dict[str, tuple[list[int], list[bool]]] = {}
        for m in pattern.finditer(code):
            type_word = m.group(1)
            if type_word in _KEYWORDS or type_word in _NOT_TYPES:
                continue
            tensor = False
            if type_word == "Tensor":
                qualifier = re.search(r"(\w+)\s*::\s*$", code[max(0, m.start() - 24) : m.start()])
                tensor = qualifier.group(1) in ("at", "torch") if qualifier else unqualified
            elif type_word == "auto":
                tensor = factory.match(code, m.start()) is not None
            starts, kinds = self.by_name.setdefault(m.group(3), ([], []))
            starts.append(m.start())
            kinds.append(tensor)

    def is_tensor(self, name: str, offset: int) -> bool:
        """Whether the nearest declaration of `name` before `offset` (else the first one) is a tensor."""
        starts, kinds = self.by_name.get(name, ([], []))
        if not starts:
            return False
        i = bisect.bisect_right(starts, offset) - 1
        return kinds[max(i, 0)]


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
