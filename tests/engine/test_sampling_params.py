"""SamplingParams / StructuredOutputsParams validation: every bad value names the field and its range."""

from __future__ import annotations

import pytest

from keel.engine import SamplingParams
from keel.engine.errors import RequestValidationError
from keel.engine.sampling_params import StructuredOutputsParams
from keel.layers.sampler import SAMPLING_EPS

BAD = [  # (kwargs, the field the error names, its message)
    (
        {"max_tokens": 0},
        "max_tokens",
        r"SamplingParams: max_tokens must be >= 1, got 0 \(0 is allowed only for scoring",
    ),
    ({"max_tokens": -1}, "max_tokens", r"SamplingParams: max_tokens must be an integer >= 0"),
    ({"min_p": 1.5}, "min_p", r"SamplingParams: min_p must be in \[0, 1\]"),
    ({"presence_penalty": 2.5}, "presence_penalty", r"SamplingParams: presence_penalty must be in \[-2, 2\]"),
    ({"frequency_penalty": -3}, "frequency_penalty", r"SamplingParams: frequency_penalty must be in \[-2, 2\]"),
    ({"logit_bias": {"x": 1}}, "logit_bias", r"SamplingParams: logit_bias must map token ids to numbers"),
    ({"logit_bias": {-1: 1}}, "logit_bias", r"SamplingParams: logit_bias keys must be token ids >= 0"),
    ({"allowed_token_ids": []}, "allowed_token_ids", r"SamplingParams: allowed_token_ids must not be empty"),
    ({"allowed_token_ids": [1, -2]}, "allowed_token_ids", r"SamplingParams: allowed_token_ids must be a list of"),
    ({"stop_token_ids": ["a"]}, "stop_token_ids", r"SamplingParams: stop_token_ids must be a list of token ids"),
    ({"stop": ["a", ""]}, "stop", r"SamplingParams: stop strings must be non-empty"),
    ({"bad_words": [" "]}, "bad_words", r"SamplingParams: bad_words must be non-empty strings"),
    ({"min_tokens": -1}, "min_tokens", r"SamplingParams: min_tokens must be an integer >= 0"),
    ({"min_tokens": 9, "max_tokens": 8}, "min_tokens", r"SamplingParams: min_tokens must be <= max_tokens \(8\)"),
    ({"logprobs": 21}, "logprobs", r"SamplingParams: logprobs must be in \[0, 20\]"),
    ({"logprobs": -1}, "logprobs", r"SamplingParams: logprobs must be an integer >= 0"),
    ({"prompt_logprobs": 30}, "prompt_logprobs", r"SamplingParams: prompt_logprobs must be in \[0, 20\]"),
    ({"n": 0}, "n", r"SamplingParams: n must be an integer >= 1"),
    ({"n": 3, "best_of": 2}, "best_of", r"SamplingParams: best_of must be >= n \(3\)"),
    ({"max_tokens": 0, "prompt_logprobs": 1, "n": 2}, "n", r"SamplingParams: n and best_of must be 1 for a scoring"),
    ({"structured_outputs": "x"}, "structured_outputs", r"SamplingParams: structured_outputs must be a Structured"),
    ({"temperature": float("nan")}, "temperature", r"SamplingParams: temperature must be >= 0"),
    ({"top_p": 0.0}, "top_p", r"SamplingParams: top_p must be in \(0, 1\]"),
    ({"top_k": -1}, "top_k", r"SamplingParams: top_k must be an integer >= 0"),
    # what the sampler cannot compute in float32 (torch.multinomial would raise for the whole batch)
    ({"temperature": 1e39}, "temperature", r"SamplingParams: temperature must be >= 0 and finite, got 1e\+39"),
    ({"repetition_penalty": 1e-300}, "repetition_penalty", r"repetition_penalty must be in \[0.01, 100\]"),
    ({"repetition_penalty": 0.0}, "repetition_penalty", r"repetition_penalty must be in \[0.01, 100\]"),
    ({"repetition_penalty": 1e6}, "repetition_penalty", r"repetition_penalty must be in \[0.01, 100\]"),
    ({"logit_bias": {5: float("inf")}}, "logit_bias", r"SamplingParams: logit_bias values must be finite"),
    ({"seed": 1 << 64}, "seed", r"SamplingParams: seed must be an integer in \[-2\*\*63, 2\*\*64\)"),
    ({"seed": "7"}, "seed", r"SamplingParams: seed must be an integer"),
]


@pytest.mark.parametrize("kwargs, field, message", BAD)
def test_bad_values_name_the_field(kwargs, field, message):
    with pytest.raises(RequestValidationError, match=message) as info:
        SamplingParams(**kwargs)
    assert isinstance(info.value, ValueError) and info.value.field == field


def test_sampler_safe_edges_are_accepted():
    """The bounds themselves pass; temperatures below SAMPLING_EPS are greedy (vLLM's rule)."""
    SamplingParams(repetition_penalty=0.01)
    SamplingParams(repetition_penalty=100.0, seed=-(1 << 63), logit_bias={3: -1e300})
    for t in (0.0, 5e-324, 1e-40, 9.9e-6):
        assert SamplingParams(temperature=t).greedy, t
    assert not SamplingParams(temperature=SAMPLING_EPS).greedy


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
    with pytest.raises(RequestValidationError, match=r"StructuredOutputsParams: exactly one of .* got none") as info:
        StructuredOutputsParams()
    assert info.value.field == "structured_outputs"
    with pytest.raises(ValueError, match=r"exactly one of .* got \['json', 'regex'\]"):
        StructuredOutputsParams(json={"type": "object"}, regex="a+")
    with pytest.raises(RequestValidationError, match="choice must be a non-empty list") as info:
        StructuredOutputsParams(choice=[])
    assert info.value.field == "structured_outputs.choice"
    s = StructuredOutputsParams(json={"type": "object", "b": 1})
    assert s.kind == "json" and s.key() == ("json", '{"b": 1, "type": "object"}')
    assert SamplingParams(structured_outputs={"regex": "a+"}).structured_outputs == StructuredOutputsParams(regex="a+")
