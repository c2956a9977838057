"""The inventory's reading of C++: comments and literals blanked (checked against tree-sitter's C++
grammar, an independent parser, on keel's own sources and a file of hard cases), directives split
off, and `#if` conditions evaluated three-valued (a build-dependent branch is code, `#if 0` is not)."""

from __future__ import annotations

from pathlib import Path

import pytest

from keel_audit.inventory.lexer import LineIndex, directives, mask
from keel_audit.inventory.preproc import evaluate, feature_guard, regions

ROOT = Path(__file__).resolve().parents[2]
HARD = r"""#include <torch/extension.h> // at::Tensor in a comment
/* TORCH_CHECK( block
   comment */ int a = 1'000'000; char q = '"'; const char* s = "at::Tensor \" TORCH_CHECK";
auto r = R"xy(TORCH_LIBRARY(" at::Tensor )" )xy"; auto u = u8"x"; wchar_t w = L'\'';
// continued comment \
TORCH_CHECK(hidden)
#define M(x) TORCH_CHECK(x, "msg") /* c */ \
   + at::kFloat
int z = 0x1'F; const char* t = "a\
TORCH_CHECK"; char c2 = u8'a'; auto e = 1.5e+3'f;
"""
_LITERAL_NODES = ("comment", "string_literal", "raw_string_literal", "char_literal", "system_lib_string")


def _literal_spans(text: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Character spans of tree-sitter's comment and literal nodes, and of the directive arguments it
    keeps as opaque text (`#define X "s"`, `#pragma ... "x"`: no nodes inside to compare with)."""
    ts = pytest.importorskip("tree_sitter")
    cpp = pytest.importorskip("tree_sitter_cpp")
    data = text.encode("utf-8")
    tree = ts.Parser(ts.Language(cpp.language())).parse(data)
    literals: list[tuple[int, int]] = []
    opaque: list[tuple[int, int]] = []

    def chars(node: object) -> tuple[int, int]:
        start = len(data[: node.start_byte].decode("utf-8", "replace"))  # type: ignore[attr-defined]
        return start, start + len(data[node.start_byte : node.end_byte].decode("utf-8", "replace"))  # type: ignore[attr-defined]

    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.type in _LITERAL_NODES:
            literals.append(chars(node))
        elif node.type == "preproc_arg":
            opaque.append(chars(node))
        else:
            stack.extend(node.children)
    return sorted(literals), opaque


def _agree(text: str) -> list[str]:
    """Where mask() and tree-sitter disagree: code blanked, or a literal's character left (a
    literal's prefix, `u8` of `u8"x"`, may go either way)."""
    masked = mask(text)
    state = ["code"] * len(text)
    literals, opaque = _literal_spans(text)
    for start, end in opaque:
        state[start:end] = ["skip"] * (end - start)
    for start, end in literals:
        if text[start] == "<":  # `#include <...>`: a header name, kept as code by mask()
            continue
        quote = min((i for i in (text.find('"', start, end), text.find("'", start, end)) if i >= 0), default=start)
        if text[start:end].startswith(("/*", "//")):
            quote = start
        state[start:quote] = ["skip"] * (quote - start)
        state[quote:end] = ["literal"] * (end - quote)
    problems = []
    for i, (a, b) in enumerate(zip(text, masked, strict=True)):
        if state[i] == "literal" and b not in (" ", "\n") and not (b == a and a in "\"'"):
            problems.append(f"offset {i}: {text[max(0, i - 20) : i + 20]!r} kept inside a literal")
        elif state[i] == "code" and a != b:
            problems.append(f"offset {i}: {text[max(0, i - 20) : i + 20]!r} blanked outside literals")
    return problems[:5]


def test_hard_cases_agree_with_tree_sitter() -> None:
    assert _agree(HARD) == []
    masked = mask(HARD)
    assert "TORCH_CHECK(hidden)" not in masked  # a // comment continued by a backslash
    assert masked.count("TORCH_CHECK") == 1  # only the macro body's
    assert len(masked) == len(HARD) and masked.count("\n") == HARD.count("\n")


@pytest.mark.parametrize("folder", ["csrc", "adapters", "vendored_deps"])
def test_keels_sources_agree_with_tree_sitter(folder: str) -> None:
    files = sorted(p for p in (ROOT / folder).rglob("*") if p.suffix in (".cpp", ".h", ".hpp", ".cu", ".cuh"))
    assert files
    for path in files:
        assert _agree(path.read_text(encoding="utf-8")) == [], path


def test_directives_and_positions() -> None:
    text = 'int x;\n  #  include "a.h"\n#define F(a) \\\n  a + 1\ny = a # b;\n'
    found = [(d.name, d.rest.strip()) for d in directives(mask(text))]
    assert found == [("include", '"   "'), ("define", "F(a) \\\n  a + 1")]  # the string is blanked
    lines = LineIndex(text)
    assert lines.position(text.index("include")) == (2, 6)
    assert lines.position(text.index("a + 1")) == (4, 3)


@pytest.mark.parametrize(
    ("condition", "value"),
    [
        ("0", 0),
        ("1", 1),
        ("false", 0),
        ("0 && defined(USE_ROCM)", 0),
        ("defined(USE_ROCM) || 1", 1),
        ("defined(USE_ROCM)", None),
        ("!defined(X) && 0", 0),
        ("(2 + 3) * 4 == 20", 1),
        ("0x10 >> 4", 1),
        ("X > 3", None),
        ("__has_include(<foo.h>)", None),
        ("1 ? 0 : 1", 0),
        ("1 / 0", None),
        ("((((", None),
    ],
)
def test_conditions(condition: str, value: int | None) -> None:
    assert evaluate(condition) == value


def test_feature_guards() -> None:
    assert feature_guard("TORCH_FEATURE_VERSION >= TORCH_VERSION_2_11_0") == ((2, 11), None)
    assert feature_guard("TORCH_FEATURE_VERSION < TORCH_VERSION_2_13_0") == (None, (2, 13))
    assert feature_guard("defined(X) && TORCH_TARGET_VERSION >= 0x020c000000000000") == ((2, 12), None)
    assert feature_guard("TORCH_FEATURE_VERSION >= TORCH_VERSION_2_11_0 || X") == (None, None)


def test_regions_disabled_guarded_alternative() -> None:
    text = (
        "#if 0\nA\n#else\nB\n#endif\n"  # A disabled, B live
        "#ifdef USE_ROCM\nC\n#else\nD\n#endif\n"  # both live, D the alternative
        "#if 1\nE\n#elif X\nF\n#else\nG\n#endif\n"  # F and G disabled
        "#if TORCH_FEATURE_VERSION >= TORCH_VERSION_2_12_0\nH\n#else\nI\n#endif\n"
        "#if 0\n#if 1\nJ\n#endif\n#endif\n"  # J under a disabled parent
    )
    spans = regions(directives(mask(text)), len(text))

    def state(letter: str) -> str:
        at = text.index(f"\n{letter}\n") + 1
        if any(s <= at < e for s, e in spans.disabled):
            return "disabled"
        guard = [v for s, e, v in spans.guarded if s <= at < e]
        return f"guard {guard[0]}" if guard else "live"

    assert [state(c) for c in "ABCDEFGHIJ"] == [
        "disabled",
        "live",
        "live",
        "live",
        "live",
        "disabled",
        "disabled",
        "guard (2, 12)",
        "live",
        "disabled",
    ]
    assert any(s <= text.index("\nD\n") < e for s, e in spans.alternative)
    assert not spans.unbalanced
    assert regions(directives(mask("#endif\n#if 1\n")), 12).unbalanced
