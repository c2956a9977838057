"""Tool calls out of model text, one parser per format (`--tool-call-parser`, as vLLM names them), shared by chat
completions, responses and messages: each parser emits the same events (`abstract.py`), each API renders them.

`plan_tools` turns a request's tools and tool_choice into a `ToolPlan`: which parser reads the output (the model
family's under "auto", chosen from the chat template when the server option is "auto"; the grammar's JSON under
"required" or a named function) and the output constraint the grammar engine enforces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from keel.entrypoints.openai.tool_parsers.abstract import (
    ArgsDelta,
    CallEnd,
    CallStart,
    Event,
    Text,
    TextGate,
    ToolCall,
    ToolParser,
    call_from_json,
)
from keel.entrypoints.openai.tool_parsers.constrained import NamedParser, PlainParser, RequiredParser, required_schema
from keel.entrypoints.openai.tool_parsers.hermes import HermesParser
from keel.entrypoints.openai.tool_parsers.llama3_json import Llama3JsonParser
from keel.entrypoints.openai.tool_parsers.mistral import MistralParser

__all__ = [
    "PARSERS",
    "PARSER_CHOICES",
    "ArgsDelta",
    "CallEnd",
    "CallStart",
    "Event",
    "Text",
    "TextGate",
    "ToolCall",
    "ToolParser",
    "ToolPlan",
    "ToolPlanError",
    "call_from_json",
    "detect",
    "plan_tools",
    "required_schema",
]

# the order `detect` tries them in: Mistral's marker is the most specific, Llama 3's the least
PARSERS: dict[str, type[ToolParser]] = {p.name: p for p in (MistralParser, HermesParser, Llama3JsonParser)}
PARSER_CHOICES = ("auto", *PARSERS)


def detect(template: str | None) -> type[ToolParser] | None:
    """The family parser whose markers a chat template holds, or None."""
    if not template:
        return None
    for parser in PARSERS.values():
        if any(marker in template for marker in parser.markers):
            return parser
    return None


class ToolPlanError(ValueError):
    """A request's tools cannot be served as asked (its 400, about `tool_choice`)."""


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """How a request's output is read for tool calls, whatever its API."""

    mode: str  # none | auto | required | named
    family: type[ToolParser] | None = None  # the format read under auto
    function: str | None = None  # the function a named tool_choice forces

    def parser(self, *, stream: bool) -> ToolParser:
        if self.mode == "auto":
            assert self.family is not None
            return self.family(stream=stream)
        if self.mode == "required":
            return RequiredParser(stream=stream)
        if self.mode == "named":
            assert self.function is not None
            return NamedParser(self.function, stream=stream)
        return PlainParser(stream=stream)

    @property
    def keeps_special_tokens(self) -> bool:
        """The format's markers are special tokens, so the output text must keep them."""
        return self.mode == "auto" and self.family is not None and self.family.keeps_special_tokens

    def finish_reason(self, reason: str | None, calls: int) -> str | None:
        """OpenAI's finish reason: "tool_calls" when a free (auto / required) output stopped on its calls."""
        if calls and self.mode in ("auto", "required") and reason == "stop":
            return "tool_calls"
        return reason


def plan_tools(
    tools: list[dict[str, Any]],
    choice: str | None,
    function: str | None,
    *,
    parser: str,
    template: str | None,
    parallel: bool,
) -> tuple[ToolPlan, list[tuple[str, dict[str, Any]]]]:
    """(plan, output constraints) of a request whose `tools` are [{"name", "parameters"}], `choice` one of none /
    auto / required / named (None: auto when there are tools), `function` the named one; `parser` is the server's
    --tool-call-parser and `template` the chat template that renders the request."""
    mode = "none" if not tools else ("named" if choice == "named" else (choice or "auto"))
    if mode == "none":
        return ToolPlan("none"), []
    if mode == "required":
        return ToolPlan("required"), [("tool_choice", {"json": required_schema(tools, parallel)})]
    if mode == "named":
        spec = next((t for t in tools if t["name"] == function), None)
        if spec is None:
            raise ToolPlanError(f"tool_choice names {function!r}, which is not among the tools")
        return ToolPlan("named", function=function), [
            ("tool_choice", {"json": spec.get("parameters") or {"type": "object", "properties": {}}})
        ]
    family = PARSERS[parser] if parser != "auto" else detect(template)
    if family is None:
        raise ToolPlanError(
            "tool_choice auto (the default with tools) needs a tool-call parser, and this model's chat template "
            f"shows none of the formats keel parses ({', '.join(PARSERS)}): start keel serve with "
            "--tool-call-parser NAME, or send tool_choice required or a named function (the grammar engine then "
            "makes any model write a valid call)"
        )
    return ToolPlan("auto", family), []
