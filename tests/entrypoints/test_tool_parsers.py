"""The tool-call parsers (hermes, llama3_json, mistral, and the grammar's required / named forms): each family's
outputs read whole and streamed in random pieces (markers split across deltas), arguments streaming before their
call ends, malformed and cut-off calls, and `auto` choosing the parser from a chat template."""

from __future__ import annotations

import json
import random

import pytest

from keel.entrypoints.openai.tool_parsers import (
    PARSERS,
    ArgsDelta,
    CallEnd,
    CallStart,
    Event,
    Text,
    ToolPlan,
    ToolPlanError,
    detect,
    plan_tools,
)
from keel.entrypoints.openai.tool_parsers.constrained import NamedParser, RequiredParser
from keel.entrypoints.openai.tool_parsers.hermes import HermesParser
from keel.entrypoints.openai.tool_parsers.llama3_json import Llama3JsonParser
from keel.entrypoints.openai.tool_parsers.mistral import MistralParser

PARIS, OSLO = {"city": "Paris"}, {"city": "Oslo", "unit": "celsius", "days": [1, 2]}

# (parser, output as the family writes it, content, calls): the shapes of Qwen2.5 / Llama 3.1 / Mistral outputs
WELL_FORMED = [
    (
        HermesParser,
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "forecast", "arguments": {"city": "Oslo", "unit": "celsius", "days": [1, 2]}}\n'
        "</tool_call>",
        "Let me check.",
        [("get_weather", PARIS), ("forecast", OSLO)],
    ),
    (HermesParser, "Paris is sunny today.", "Paris is sunny today.", []),
    (
        HermesParser,
        '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}\n</tool_call>',
        None,
        [("get_weather", PARIS)],
    ),
    (
        Llama3JsonParser,
        '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "forecast", "parameters": {"city": "Oslo", "unit": "celsius", "days": [1, 2]}}',
        None,
        [("get_weather", PARIS), ("forecast", OSLO)],
    ),
    (
        Llama3JsonParser,
        '<|python_tag|>{"type": "function", "name": "get_weather", "parameters": {"city": "Paris"}}',
        None,
        [("get_weather", PARIS)],
    ),
    (Llama3JsonParser, "It is sunny in {Paris}.", "It is sunny in {Paris}.", []),
    (
        MistralParser,
        'Sure. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "forecast", "arguments": {"city": "Oslo", "unit": "celsius", "days": [1, 2]}}]',
        "Sure.",
        [("get_weather", PARIS), ("forecast", OSLO)],
    ),
    (
        MistralParser,
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
        '[TOOL_CALLS]forecast[CALL_ID]a1b2c3d4e[ARGS]{"city": "Oslo", "unit": "celsius", "days": [1, 2]}',
        None,
        [("get_weather", PARIS), ("forecast", OSLO)],
    ),
    (
        RequiredParser,
        '[{"name": "get_weather", "parameters": {"city": "Paris"}}, '
        '{"name": "forecast", "parameters": {"city": "Oslo", "unit": "celsius", "days": [1, 2]}}]',
        None,
        [("get_weather", PARIS), ("forecast", OSLO)],
    ),
]

# outputs that look like calls but are not: whole, what the model wrote comes back as text
MALFORMED = [
    (HermesParser, "<tool_call>{not json}</tool_call>"),
    (HermesParser, '<tool_call>{"arguments": {"city": "Paris"}}</tool_call>'),  # no name
    (HermesParser, '<tool_call>{"name": "f", "arguments": [1]}</tool_call>'),  # arguments not an object
    (HermesParser, '<tool_call>{"name": "f", "arguments": {"a": 1}} trailing</tool_call>'),
    (HermesParser, "<tool_call>hello</tool_call>"),
    (Llama3JsonParser, '{"name": "f", "parameters": {"a": 1}} and then some words'),
    (Llama3JsonParser, '{"name": "f", "parameters": {"a": 1}}; {"oops"}'),
    (MistralParser, "[TOOL_CALLS] not a call"),
    (MistralParser, '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}, 7]'),
    (MistralParser, "[TOOL_CALLS]bad name![ARGS]{}"),
    (MistralParser, '[TOOL_CALLS]f[ARGS]{"a": oops}'),
    (RequiredParser, '[{"name": "f", "parameters": {"a": 1}'),  # cut at max_tokens
]


def pieces(text: str, seed: int) -> list[str]:
    """`text` cut at random places (1-6 characters), as a detokenizer's deltas come."""
    rng, out, i = random.Random(seed), [], 0
    while i < len(text):
        n = rng.randint(1, 6)
        out.append(text[i : i + n])
        i += n
    return out


def run_stream(parser, deltas: list[str]) -> list[tuple[int, Event]]:
    """Every event with the number of the delta that released it (len(deltas) for finish)."""
    out = [(k, e) for k, d in enumerate(deltas) for e in parser.feed(d)]
    return out + [(len(deltas), e) for e in parser.finish()]


def summary(events) -> tuple[str, list[tuple[str, object]]]:
    content = "".join(e.text for e in events if isinstance(e, Text))
    calls = [(e.call.name, json.loads(e.call.arguments)) for e in events if isinstance(e, CallEnd)]
    return content, calls


@pytest.mark.parametrize("case", WELL_FORMED, ids=lambda c: c[0].name if isinstance(c, tuple) else None)
def test_whole_output_gives_content_and_calls(case):
    parser, text, content, calls = case
    got_content, got_calls = parser(stream=False).parse(text)
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in got_calls] == calls
    assert len({c.id for c in got_calls}) == len(got_calls)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("case", WELL_FORMED, ids=lambda c: c[0].name if isinstance(c, tuple) else None)
def test_streamed_pieces_give_what_the_whole_output_gives(case, seed):
    parser, text, content, calls = case
    deltas = pieces(text, seed)
    events = [e for _, e in run_stream(parser(stream=True), deltas)]
    got_content, got_calls = summary(events)
    assert got_content.strip() == (content or "")
    assert got_calls == calls
    markers = [m for p in PARSERS.values() for m in p.markers if m.startswith(("<", "["))]
    assert not any(m in e.text for e in events if isinstance(e, Text) for m in markers)
    for index, (name, _) in enumerate(calls):  # each call: start, its argument deltas, end, in that order
        own = [e for e in events if not isinstance(e, Text) and e.index == index]
        assert isinstance(own[0], CallStart) and own[0].name == name and isinstance(own[-1], CallEnd)
        assert own[-1].call.id == own[0].id
        assert "".join(e.text for e in own if isinstance(e, ArgsDelta)) == own[-1].call.arguments


@pytest.mark.parametrize("parser", [HermesParser, Llama3JsonParser, MistralParser, RequiredParser])
def test_arguments_stream_before_the_call_ends(parser):
    text = next(t for p, t, _, calls in WELL_FORMED if p is parser and calls)
    deltas = pieces(text, 1)
    timed = run_stream(parser(stream=True), deltas)
    first = next(k for k, e in timed if isinstance(e, CallEnd))
    early = [e for k, e in timed if isinstance(e, ArgsDelta) and e.index == 0 and k < first]
    assert len(early) >= 3, "the first call's arguments came in one piece at its end, not as they were written"
    start = next(k for k, e in timed if isinstance(e, CallStart))
    assert start < first


@pytest.mark.parametrize("case", MALFORMED, ids=lambda c: c[0].name if isinstance(c, tuple) else None)
def test_malformed_calls_come_back_as_text(case):
    parser, text = case
    content, calls = parser(stream=False).parse(text)
    assert calls == [] and content.strip() == text.strip()


@pytest.mark.parametrize("seed", range(3))
def test_a_malformed_block_streams_as_text_and_the_next_call_still_parses(seed):
    text = 'a<tool_call>{not json}</tool_call>b<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
    events = [e for _, e in run_stream(HermesParser(stream=True), pieces(text, seed))]
    assert summary(events) == ("a<tool_call>{not json}</tool_call>b", [("f", {"x": 1})])


def test_markers_split_across_deltas():
    p = HermesParser(stream=True)
    assert p.feed("hello <tool") == [Text("hello ")]  # only what may become the tag is held back
    assert p.feed("box> x") == [Text("<toolbox> x")]  # it did not: released
    p = MistralParser(stream=True)
    assert p.feed("ok [TOOL") == [Text("ok ")]
    events = p.feed("_CALLS]get_weather[AR") + p.feed('GS]{"city": "Pa') + p.feed('ris"}')
    assert [type(e).__name__ for e in events] == ["CallStart", "ArgsDelta", "ArgsDelta", "CallEnd"]
    assert events[-1].call.arguments == '{"city": "Paris"}' and len(events[-1].call.id) == 9


def test_an_output_cut_inside_a_call():
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Par'
    assert HermesParser(stream=False).parse(text) == (text, [])  # whole: not a call, the text as written
    events = [e for _, e in run_stream(HermesParser(stream=True), pieces(text, 0))]
    (end,) = [e for e in events if isinstance(e, CallEnd)]  # streamed: announced, so it ends with what came
    assert end.call.name == "get_weather" and end.call.arguments == '{"city": "Par'
    whole = '<tool_call>{"name": "f", "arguments": {"a": 1}}'  # unclosed block, whole object: a call
    assert HermesParser(stream=False).parse(whole)[1][0].arguments == '{"a": 1}'


def test_named_function_output_is_its_arguments():
    events = [e for _, e in run_stream(NamedParser("get_weather", stream=True), ['{"city"', ': "Paris"}'])]
    assert [type(e).__name__ for e in events] == ["CallStart", "ArgsDelta", "ArgsDelta", "CallEnd"]
    assert events[-1].call.arguments == '{"city": "Paris"}'
    content, (call,) = NamedParser("f", stream=False).parse('{"a": 1}')
    assert content is None and call.name == "f" and call.arguments == '{"a": 1}'


TEMPLATES = {  # the lines of each family's chat template that show its format
    "hermes": "For each function call, return a json object within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>',
    "llama3_json": "{%- if builtin_tools is defined %}{{- '<|python_tag|>' + tool_call.name }}{%- else %}"
    "{{- '{\"name\": \"' + tool_call.name + '\", ' }}{{- '\"parameters\": ' }}",
    "mistral": '{{- "[TOOL_CALLS] [" }}{%- for tool_call in message.tool_calls %}',
}


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_auto_picks_the_parser_from_the_template(name):
    assert detect(TEMPLATES[name]) is PARSERS[name]
    plan, constraints = plan_tools(
        [{"name": "f", "parameters": None}], None, None, parser="auto", template=TEMPLATES[name], parallel=True
    )
    assert plan == ToolPlan("auto", PARSERS[name]) and constraints == []
    assert plan.keeps_special_tokens == (name != "hermes")


def test_plans_for_every_tool_choice():
    tools = [{"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}]
    plain = "{% for m in messages %}{{ m.content }}{% endfor %}"
    with pytest.raises(ToolPlanError, match="--tool-call-parser"):
        plan_tools(tools, "auto", None, parser="auto", template=plain, parallel=True)
    plan, _ = plan_tools(tools, None, None, parser="hermes", template=plain, parallel=True)
    assert plan.family is HermesParser  # the operator's choice holds whatever the template
    plan, (constraint,) = plan_tools(tools, "required", None, parser="auto", template=plain, parallel=False)
    assert plan.mode == "required" and constraint[1]["json"]["maxItems"] == 1
    plan, (constraint,) = plan_tools(tools, "named", "f", parser="auto", template=plain, parallel=True)
    assert plan.function == "f" and constraint[1]["json"] == tools[0]["parameters"]
    with pytest.raises(ToolPlanError, match="'g'"):
        plan_tools(tools, "named", "g", parser="auto", template=plain, parallel=True)
    assert plan_tools([], "auto", None, parser="auto", template=plain, parallel=True)[0].mode == "none"
    assert plan_tools(tools, "none", None, parser="auto", template=plain, parallel=True)[0].mode == "none"
    assert ToolPlan("auto", HermesParser).finish_reason("stop", 1) == "tool_calls"
    assert ToolPlan("named", function="f").finish_reason("stop", 1) == "stop"  # OpenAI's rule for a forced call
