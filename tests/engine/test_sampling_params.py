"""SamplingParams / StructuredOutputsParams validation: every bad value names the field and its range."""

from __future__ import annotations

import pytest

from keel.engine import SamplingParams
from keel.engine.sampling_params import StructuredOutputsParams

BAD = [
    ({"max_tokens": 0}, r"SamplingParams: max_tokens must be >= 1, got 0 \(0 is allowed only for scoring"),
    ({"max_tokens": -1}, r"SamplingParams: max_tokens must be an integer >= 0"),
    ({"min_p": 1.5}, r"SamplingParams: min_p must be in \[0, 1\]"),
    ({"presence_penalty": 2.5}, r"SamplingParams: presence_penalty must be in \[-2, 2\]"),
    ({"frequency_penalty": -3}, r"SamplingParams: frequency_penalty must be in \[-2, 2\]"),
    ({"logit_bias": {"x": 1}}, r"SamplingParams: logit_bias must map token ids to numbers"),
    ({"logit_bias": {-1: 1}}, r"SamplingParams: logit_bias keys must be token ids >= 0"),
    ({"allowed_token_ids": []}, r"SamplingParams: allowed_token_ids must not be empty"),
    ({"allowed_token_ids": [1, -2]}, r"SamplingParams: allowed_token_ids must be a list of token ids >= 0"),
    ({"stop_token_ids": ["a"]}, r"SamplingParams: stop_token_ids must be a list of token ids >= 0"),
    ({"bad_words": [" "]}, r"SamplingParams: bad_words must be non-empty strings"),
    ({"min_tokens": -1}, r"SamplingParams: min_tokens must be an integer >= 0"),
    ({"min_tokens": 9, "max_tokens": 8}, r"SamplingParams: min_tokens must be <= max_tokens \(8\)"),
    ({"logprobs": 21}, r"SamplingParams: logprobs must be in \[0, 20\]"),
    ({"logprobs": -1}, r"SamplingParams: logprobs must be an integer >= 0"),
    ({"prompt_logprobs": 30}, r"SamplingParams: prompt_logprobs must be in \[0, 20\]"),
    ({"n": 0}, r"SamplingParams: n must be an integer >= 1"),
    ({"n": 3, "best_of": 2}, r"SamplingParams: best_of must be >= n \(3\)"),
    ({"max_tokens": 0, "prompt_logprobs": 1, "n": 2}, r"SamplingParams: n and best_of must be 1 for a scoring"),
    ({"structured_outputs": "x"}, r"SamplingParams: structured_outputs must be a StructuredOutputsParams"),
    ({"temperature": float("nan")}, r"SamplingParams: temperature must be >= 0"),
]


@pytest.mark.parametrize("kwargs, message", BAD)
def test_bad_values_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_defaults_are_off_and_scoring_requests_allowed():
    p = SamplingParams()
    assert (p.n, p.best_of, p.min_p, p.logprobs, p.prompt_logprobs, p.structured_outputs) == (
        1,
        None,
        0.0,
        None,
        None,
        None,
    )
    assert SamplingParams(max_tokens=0, prompt_logprobs=0).max_tokens == 0
    assert SamplingParams(logit_bias={"5": 2}).logit_bias == {5: 2.0}  # JSON keys arrive as strings
    assert SamplingParams(n=2, best_of=4).num_candidates == 4


def test_structured_outputs_needs_exactly_one_field():
    with pytest.raises(ValueError, match=r"StructuredOutputsParams: exactly one of .* got none"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match=r"exactly one of .* got \['json', 'regex'\]"):
        StructuredOutputsParams(json={"type": "object"}, regex="a+")
    with pytest.raises(ValueError, match="choice must be a non-empty list"):
        StructuredOutputsParams(choice=[])
    s = StructuredOutputsParams(json={"type": "object", "b": 1})
    assert s.kind == "json" and s.key() == ("json", '{"b": 1, "type": "object"}')
    assert SamplingParams(structured_outputs={"regex": "a+"}).structured_outputs == StructuredOutputsParams(regex="a+")
