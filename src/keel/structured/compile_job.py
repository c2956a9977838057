"""Spec -> llguidance grammar, and the grammar worker's job (`Handler`), which runs in a sandbox process.

This module imports json and llguidance only (a sandbox worker must not import keel, which loads torch).
What is expensive and unbounded in llguidance for a hostile spec is building the grammar's lexer: a
JSON schema's `allOf` of string patterns becomes an intersection of regexes, and deciding whether that
intersection is empty builds an automaton that grows exponentially with the number of patterns, under no
llguidance limit. The worker does that (the matcher's construction and its first token mask) and
returns only the grammar text; the server then builds its own matcher from that text, which costs what
the bounded worker just spent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# compact JSON (no free whitespace between tokens): a small model cannot wander off into blank lines, and
# the output is what json.dumps(separators=(",", ":")) writes
JSON_OPTIONS = {"whitespace_flexible": False}

KINDS = ("json", "json_object", "regex", "choice", "grammar")


class SpecError(ValueError):
    """A spec llguidance refuses; `field` names the request field (structured_outputs.<kind>)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def grammar_text(kind: str, value: Any) -> str:
    """The llguidance grammar of one spec; SpecError("structured_outputs.<kind>: ...") when it is bad."""
    from llguidance import LLMatcher, grammar_from

    try:
        if kind == "json":
            schema = json.loads(value) if isinstance(value, str) else value
            if not isinstance(schema, dict | bool):
                raise ValueError(f"a JSON schema is an object, got {type(schema).__name__}")
            return str(LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_OPTIONS))  # type: ignore[arg-type]
        if kind == "json_object":
            return str(LLMatcher.grammar_from_json_schema('{"type": "object"}', defaults=JSON_OPTIONS))  # type: ignore[arg-type]
        if kind == "regex":
            return str(LLMatcher.grammar_from_regex(value))
        if kind == "choice":
            return str(grammar_from("choice", json.dumps(list(value))))
        if kind == "grammar":
            return str(grammar_from("grammar", value))  # Lark, or GBNF (converted)
    except (ValueError, TypeError, RecursionError) as exc:
        raise SpecError(f"structured_outputs.{kind}", f"structured_outputs.{kind}: {exc}") from exc
    raise SpecError("structured_outputs", f"structured_outputs: unknown kind {kind!r}; expected {', '.join(KINDS)}")


def parser_limits(values: dict[str, Any]) -> Any:
    """llguidance's LLParserLimits from plain values (fields left out keep llguidance's defaults)."""
    from llguidance import LLParserLimits

    return LLParserLimits(**{k: v for k, v in values.items() if v is not None}, verbose_errors=False)


def build_matcher(tokenizer: Any, grammar: str, limits: Any, where: str) -> Any:
    """A matcher of `grammar` with its first token mask computed; SpecError naming `where` when llguidance
    refuses the grammar or stops under its limits."""
    from llguidance import LLMatcher

    err = LLMatcher.validate_grammar(grammar, tokenizer, limits=limits)
    if err and not err.startswith("WARNING"):
        raise SpecError(where, f"{where}: {err}")
    matcher = LLMatcher(tokenizer, grammar, log_level=0, limits=limits)
    if not matcher.is_error():
        matcher.compute_bitmask()  # the first mask builds the lexer states the first token needs
    if matcher.is_error():
        raise SpecError(where, f"{where}: {matcher.get_error()}")
    return matcher


class Handler:
    """The grammar worker: init {"tokenizer_json", "vocab_size", "eos", "parser_limits"}; a job {"kind",
    "value"} answers {"grammar"} once llguidance built a matcher of it and its first mask."""

    def __init__(self, init: dict[str, Any]) -> None:
        import llguidance

        text = Path(init["tokenizer_json"]).read_text(encoding="utf-8")
        self.tokenizer = llguidance.LLTokenizer(text, n_vocab=init["vocab_size"], eos_token=init.get("eos") or None)
        self.limits = parser_limits(init.get("parser_limits") or {})

    def __call__(self, job: dict[str, Any]) -> dict[str, Any]:
        kind = job["kind"]
        grammar = grammar_text(kind, job["value"])
        build_matcher(self.tokenizer, grammar, self.limits, f"structured_outputs.{kind}")
        return {"grammar": grammar}
