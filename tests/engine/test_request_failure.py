"""One request's failure stays its own: a request whose sampler row cannot be sampled, or whose
forward pass raises, finishes with finish_reason "error" and `.error`; `step` does not raise, and a
concurrent request completes with the tokens it gets alone."""

from __future__ import annotations

import pytest
from support.native import needs_ops

from keel.engine import LLM, LLMEngine, RequestValidationError, SamplingParams

pytestmark = needs_ops
GOOD = SamplingParams(max_tokens=12, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.9, seed=7)


@pytest.fixture(scope="module")
def engine(hf_cache) -> LLMEngine:
    return LLMEngine("keel-test/tiny-llama", dtype="float32", device="cpu", block_size=4, progress=False)


def run(engine: LLMEngine, requests: dict) -> dict:
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    final = {}
    while engine.has_unfinished_requests():
        final.update({o.request_id: o for o in engine.step() if o.finished})
    assert engine.metrics().kv_blocks_used == 0
    return final


def hostile() -> SamplingParams:
    """Values validation refuses, set after it (as a validation gap would let them through): a
    repetition penalty of 1e-300 is 0 in float32, the seen tokens' logits become inf and the probs NaN."""
    p = SamplingParams(max_tokens=12, temperature=1.0)
    p.repetition_penalty = 1e-300
    return p


def test_a_request_the_sampler_cannot_sample_fails_alone(engine):
    alone = run(engine, {"g": ("Hello world", GOOD), "r": ("The quick brown fox", SEEDED)})
    got = run(
        engine,
        {"g": ("Hello world", GOOD), "bad": ("Paged attention", hostile()), "r": ("The quick brown fox", SEEDED)},
    )
    assert got["bad"].finish_reason == "error" and "NaN" in got["bad"].error and got["bad"].token_ids == []
    for rid in ("g", "r"):
        assert got[rid].token_ids == alone[rid].token_ids and got[rid].error is None


def test_a_request_whose_forward_pass_raises_fails_alone(engine, monkeypatch):
    alone = run(engine, {"g": ("Hello world", GOOD), "r": ("The quick brown fox", SEEDED)})
    poison = engine.tokenizer.encode("Paged attention")[-1]
    assert poison not in engine.tokenizer.encode("Hello world") + alone["g"].token_ids
    model = engine.runner.model
    real = model.forward

    def forward(input_ids, positions, ctx):
        if bool((input_ids == poison).any()):
            raise RuntimeError("a kernel refused this request's input")
        return real(input_ids, positions, ctx)

    monkeypatch.setattr(model, "forward", forward)
    got = run(
        engine, {"g": ("Hello world", GOOD), "bad": ("Paged attention", GOOD), "r": ("The quick brown fox", SEEDED)}
    )
    assert got["bad"].finish_reason == "error" and "a kernel refused" in got["bad"].error
    for rid in ("g", "r"):
        assert got[rid].token_ids == alone[rid].token_ids and got[rid].finish_reason == "length"


def test_llm_generate_returns_the_failed_request_with_its_error(hf_cache):
    llm = LLM("keel-test/tiny-llama", dtype="float32", device="cpu", block_size=4, progress=False)
    outs = llm.generate(["Hello world", "Paged attention"], [GOOD, hostile()])
    assert outs[0].finish_reason == "length" and len(outs[0].token_ids) == 12
    assert outs[1].finish_reason == "error" and outs[1].error and outs[1].outputs[0].finish_reason == "error"
    assert not llm.llm_engine.has_unfinished_requests()


def test_a_refused_request_names_its_field(engine):
    """make_sequence's refusals are RequestValidationErrors too: the server reads `.field`."""
    vocab = engine.config.vocab_size
    cases = [
        ([], GOOD, "prompt"),
        ([1, vocab], GOOD, "prompt"),
        ([5] * 128, GOOD, "prompt"),
        ([5], SamplingParams(logit_bias={vocab: 1.0}), "logit_bias"),
        ([5], SamplingParams(allowed_token_ids=[vocab]), "allowed_token_ids"),
    ]
    for prompt, params, field in cases:
        with pytest.raises(RequestValidationError) as info:
            engine.add_request("x", prompt, params)
        assert info.value.field == field, (prompt[:3], str(info.value))
    assert not engine.has_unfinished_requests()


def test_engine_setters_keep_the_config_valid(engine):
    from keel.engine import ConfigError

    with pytest.raises(ConfigError, match="max_num_batched_tokens must be >= max_num_seqs") as info:
        engine.max_num_seqs = engine.engine_config.max_num_batched_tokens + 1
    assert info.value.field == "max_num_batched_tokens" and engine.max_num_seqs == engine.engine_config.max_num_seqs
