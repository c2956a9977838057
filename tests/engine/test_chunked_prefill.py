"""Chunked prefill under the scheduler's token budget (max_num_batched_tokens): a chunked prompt gives the
tokens and logprobs of a whole one, a running decode keeps stepping while a long prompt is prefilled (and a
request that arrives meanwhile starts at once), preemption still recomputes the same tokens."""

from __future__ import annotations

import math

import pytest
from support.native import needs_ops

from keel.engine import LLMEngine, SamplingParams

pytestmark = needs_ops
TEXT = "The quick brown fox jumps over the lazy dog. Paged attention stores keys and values in fixed-size blocks. "


def make(block_size: int, budget: int, **kw) -> LLMEngine:
    kw.setdefault("max_num_seqs", 4)
    return LLMEngine(
        "keel-test/tiny-llama",
        dtype="float32",
        device="cpu",
        block_size=block_size,
        max_num_batched_tokens=budget,
        progress=False,
        **kw,
    )


def prompt(engine: LLMEngine, n: int) -> list[int]:
    ids = engine.tokenizer.encode(TEXT * 8)
    assert len(ids) >= n
    return ids[:n]


def run(engine: LLMEngine, requests: dict, trace: list | None = None) -> dict:
    for rid, (ids, params) in requests.items():
        engine.add_request(rid, ids, params)
    final = {}
    while engine.has_unfinished_requests():
        outs = engine.step()
        if trace is not None:
            trace.append(outs)
        final.update({o.request_id: o for o in outs if o.finished})
    return final


def max_logprob_diff(a: list, b: list) -> float:
    """Largest |difference| of the logprobs of two lists of {token id: Logprob} (None entries equal)."""
    worst = 0.0
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert (x is None) == (y is None)
        if x is None:
            continue
        assert set(x) == set(y) and all(x[t].rank == y[t].rank for t in x)
        worst = max(worst, *(abs(x[t].logprob - y[t].logprob) for t in x))
    return worst


@pytest.mark.parametrize("block_size", [4, 16])  # the gathered varlen path and the paged kernels
def test_chunked_prompt_gives_the_tokens_and_logprobs_of_a_whole_one(hf_cache, block_size):
    whole, chunked = make(block_size, 512), make(block_size, 7)  # 7: chunks cross block boundaries
    ids = prompt(whole, 100)
    params = SamplingParams(max_tokens=20, ignore_eos=True, logprobs=5, prompt_logprobs=5)
    scoring = SamplingParams(max_tokens=0, prompt_logprobs=3)
    trace: list = []
    a = run(whole, {"g": (ids, params), "s": (ids[:90], scoring)})
    b = run(chunked, {"g": (ids, params), "s": (ids[:90], scoring)}, trace)
    first = next(i for i, outs in enumerate(trace) if any(o.request_id == "g" for o in outs))
    assert first >= math.ceil(100 / 7) - 1  # the prompt took its chunks, one step each
    assert b["g"].token_ids == a["g"].token_ids
    assert len(b["g"].prompt_logprobs) == 100 and len(b["s"].prompt_logprobs) == 90
    # fp32: the same kernels over different query chunks; equal to 1e-5 (measured: bitwise on this CPU)
    assert max_logprob_diff(b["g"].prompt_logprobs, a["g"].prompt_logprobs) <= 1e-5
    assert max_logprob_diff(b["s"].prompt_logprobs, a["s"].prompt_logprobs) <= 1e-5
    assert max_logprob_diff(b["g"].logprobs, a["g"].logprobs) <= 1e-5
    assert b["s"].finish_reason == "length" and b["s"].token_ids == []


def test_a_decode_keeps_stepping_while_a_long_prompt_prefills(hf_cache):
    engine = make(16, 16)
    short = SamplingParams(max_tokens=40, ignore_eos=True)
    alone = run(engine, {"d": ("Hello world", short)})["d"].token_ids
    engine.add_request("d", "Hello world", short)
    engine.step()
    engine.step()
    engine.add_request("s", prompt(engine, 120), SamplingParams(max_tokens=0, prompt_logprobs=1))
    steps = 0
    while "s" in engine._requests:
        outs = engine.step()
        steps += 1
        assert [len(o.new_token_ids) for o in outs if o.request_id == "d"] == [1], f"step {steps}: d stalled"
    assert steps >= math.ceil(120 / 15)  # 15 of the 16 tokens a step went to the long prompt
    final = run(engine, {})
    assert final["d"].token_ids == alone


def test_a_request_arriving_during_a_long_prefill_starts_at_once(hf_cache):
    engine = make(16, 16)
    engine.add_request("s", prompt(engine, 120), SamplingParams(max_tokens=1, ignore_eos=True))
    engine.step()
    engine.add_request("d", "Hello world", SamplingParams(max_tokens=3, ignore_eos=True))
    outs = engine.step()
    assert [o.request_id for o in outs] == ["d"]  # d's prompt went before s's next chunk: its first token
    steps = 1
    while "d" in engine._requests:
        outs = engine.step()
        steps += 1
    assert steps == 3 and "s" in engine._requests  # d finished while s was still prefilling
    run(engine, {})


def test_preemption_during_chunked_prefill_recomputes_the_same(hf_cache):
    probe = make(16, 512)
    prompts = [prompt(probe, n) for n in (20, 100, 50)]
    params = SamplingParams(max_tokens=24, ignore_eos=True, prompt_logprobs=2)
    want = run(probe, {str(i): (p, params) for i, p in enumerate(prompts)})
    per_block = probe.runner.kv_bytes_per_block()
    bm = probe.scheduler.block_manager
    # room for the first two prompts: the first one's decode, past its blocks, preempts the second one
    # while that one's prompt is still being prefilled in 8-token chunks
    pool = bm.blocks_for(len(prompts[0])) + bm.blocks_for(len(prompts[1]))
    engine = make(16, 8, max_kv_cache_bytes=pool * per_block)
    preempted_mid_prefill = []
    real = engine.scheduler._preempt

    def spy(seq):
        preempted_mid_prefill.append(0 < seq.num_computed_tokens < seq.num_prompt)
        real(seq)

    engine.scheduler._preempt = spy
    got = run(engine, {str(i): (p, params) for i, p in enumerate(prompts)})
    m = engine.metrics()
    assert m.num_preemptions > 0 and any(preempted_mid_prefill) and m.kv_blocks_used == 0
    for i in range(3):
        assert got[str(i)].token_ids == want[str(i)].token_ids
        assert max_logprob_diff(got[str(i)].prompt_logprobs, want[str(i)].prompt_logprobs) <= 1e-5
