"""Structured outputs (llguidance) on the tiny random checkpoints: whatever the model prefers, the output
parses and validates (jsonschema), fullmatches the regex, is one of the choices, or follows the grammar."""

from __future__ import annotations

import json
import re

import pytest
from support.native import needs_ops

from keel.engine import SamplingParams
from keel.engine.sampling_params import StructuredOutputsParams as SO

pytestmark = needs_ops
PROMPT = "The quick brown fox"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pet": {"enum": ["cat", "dog"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["name", "age", "pet", "tags"],
    "additionalProperties": False,
}


def run(llm, so: SO, seeds=(0, 1, 2), max_tokens=80, **kw):
    params = [
        SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=s, structured_outputs=so, **kw) for s in seeds
    ]
    params.append(SamplingParams(max_tokens=max_tokens, structured_outputs=so, **kw))  # greedy too
    return llm.generate([PROMPT] * len(params), params)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_json_schema_output_validates(arch, llms):
    import jsonschema

    for out in run(llms(arch), SO(json=SCHEMA)):
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), SCHEMA)


def test_json_object_and_schema_as_string(llms):
    llm = llms("llama")
    for out in run(llm, SO(json_object=True), max_tokens=100):
        if out.finish_reason == "stop":  # an unbounded object may run out of tokens; what ended must parse
            assert isinstance(json.loads(out.text), dict)
    # no other keys: the output ends within max_tokens whatever the seed (with them, a random model wrote
    # keys until the length cut for some seeds)
    small = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    for out in run(llm, SO(json=json.dumps(small))):
        assert isinstance(json.loads(out.text)["ok"], bool)


def test_regex_fullmatch(llms):
    pattern = r"[a-c]{2,5}-\d{1,3}"
    for out in run(llms("qwen2"), SO(regex=pattern)):
        assert out.finish_reason == "stop" and re.fullmatch(pattern, out.text), out.text


def test_choice_membership(llms):
    choices = ["alpha", "beta gamma", "δ"]
    outs = run(llms("llama"), SO(choice=choices), seeds=range(6))
    assert all(o.text in choices for o in outs), [o.text for o in outs]


def test_lark_grammar(llms):
    grammar = 'start: "(" num (" + " num)* ")"\nnum: /[1-9][0-9]?/'
    for out in run(llms("llama"), SO(grammar=grammar), max_tokens=60):
        if out.finish_reason == "stop":
            assert re.fullmatch(r"\([1-9][0-9]?( \+ [1-9][0-9]?)*\)", out.text), out.text


def test_constrained_and_plain_requests_in_one_batch(llms):
    llm = llms("qwen2")
    plain = llm.generate([PROMPT, "Sphinx of"], SamplingParams(max_tokens=6, ignore_eos=True))
    mixed = llm.generate(
        [PROMPT, "Sphinx of", PROMPT],
        [SamplingParams(max_tokens=6, ignore_eos=True)] * 2
        + [SamplingParams(max_tokens=20, structured_outputs=SO(regex="(yes|no)"))],
    )
    assert [o.token_ids for o in mixed[:2]] == [o.token_ids for o in plain]
    assert mixed[2].text in ("yes", "no")


def test_compiled_grammars_are_cached(llms):
    llm = llms("llama")
    grammars = llm.llm_engine.grammars()
    before = grammars.num_compiled
    so = {"type": "object", "properties": {"k": {"enum": ["x", "y"]}}, "required": ["k"]}
    run(llm, SO(json=so), seeds=(0,))
    run(llm, SO(json=dict(reversed(so.items()))), seeds=(1,))  # the same schema, keys in another order
    assert grammars.num_compiled == before + 1


@pytest.mark.parametrize(
    "so, message",
    [
        (SO(regex="(ab"), r"structured_outputs\.regex: "),
        (SO(json="{not json"), r"structured_outputs\.json: "),
        (SO(json='"a string"'), r"structured_outputs\.json: a JSON schema is an object"),
        (SO(json={"type": "nonsense"}), r"structured_outputs\.json: "),
        (SO(grammar="start: undefined_rule"), r"structured_outputs\.grammar: "),
    ],
)
def test_bad_specs_fail_at_add_request(so, message, llms):
    engine = llms("llama").llm_engine
    with pytest.raises(ValueError, match=message):
        engine.add_request("bad-spec", PROMPT, SamplingParams(structured_outputs=so))
    assert not engine.has_unfinished_requests()


def test_grammar_end_finishes_the_request_even_with_ignore_eos(llms):
    so = SO(regex="(yes|no)")
    out = llms("llama").generate(PROMPT, SamplingParams(max_tokens=20, ignore_eos=True, structured_outputs=so))[0]
    assert out.finish_reason == "stop" and out.text in ("yes", "no")


def test_a_compile_past_its_limit_fails_its_request_in_a_worker_process(llms):
    """Patterns behind `$ref`s pass the static count; their intersection runs into the compile worker's time
    limit, which ends that worker (not this process) and fails the request naming the limit."""
    from keel.structured.grammar import GrammarLimits

    engine = llms("llama").llm_engine
    grammars = engine.grammars()
    before = grammars.limits
    grammars.configure(GrammarLimits(compile_timeout_s=1.0))
    try:
        letters = "abcdefghijklmnopqr"
        schema = {
            "$defs": {c: {"pattern": f".*{c}.*"} for c in letters},
            "type": "string",
            "allOf": [{"$ref": f"#/$defs/{c}"} for c in letters],
        }
        with pytest.raises(ValueError, match=r"structured_outputs\.json: .*limit of (1 s|512 MiB)"):
            engine.add_request("slow-spec", PROMPT, SamplingParams(structured_outputs=SO(json=schema)))
        assert grammars.workers.num_killed == 1 and not engine.has_unfinished_requests()
        out = llms("llama").generate(PROMPT, SamplingParams(max_tokens=4, structured_outputs=SO(regex="(yes|no)")))[0]
        assert out.text in ("yes", "no")
    finally:
        grammars.configure(before)
