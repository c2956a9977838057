"""Sampler pieces against transformers' logits processors, plus stop handling and streaming."""

from __future__ import annotations

import pytest
import torch
from support.native import needs_ops

from keel.engine import SamplingParams
from keel.engine.block_manager import BlockManager, CacheFullError, slot_mapping
from keel.layers.sampler import apply_repetition_penalty, filter_top_k_top_p


def test_repetition_penalty_matches_transformers():
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    logits = torch.randn(1, 50)
    seen = torch.tensor([[3, 7, 7, 20]])
    ref = RepetitionPenaltyLogitsProcessor(1.5)(seen, logits.clone())
    got = logits[0].clone()
    apply_repetition_penalty(got, seen[0].unique(), 1.5)
    torch.testing.assert_close(got, ref[0])


@pytest.mark.parametrize("top_k, top_p", [(5, 1.0), (0, 0.7), (10, 0.5), (0, 0.999)])
def test_top_k_top_p_match_transformers(top_k, top_p):
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    logits = torch.randn(1, 100) * 3
    ref = logits.clone()
    if top_k:
        ref = TopKLogitsWarper(top_k)(None, ref)
    if top_p < 1.0:
        ref = TopPLogitsWarper(top_p)(None, ref)
    got = filter_top_k_top_p(logits[0].clone(), top_k, top_p)
    assert torch.equal(torch.isinf(got), torch.isinf(ref[0]))


def test_sampling_params_validation():
    with pytest.raises(ValueError, match="top_p must be in"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        SamplingParams(max_tokens=0)
    assert SamplingParams(stop="x").stop == ["x"]


def test_block_manager_reserves_and_frees():
    bm = BlockManager(4, 16)
    table = bm.allocate(33)
    assert len(table) == 3 and bm.num_free == 1 and slot_mapping(table, 16, 17, 18) == [table[1] * 16 + 1]
    assert not bm.can_allocate(17)
    bm.free(table)
    assert bm.num_free == 4 and table == []
    with pytest.raises(CacheFullError, match="needs 5 blocks of 16; the KV cache has only 4"):
        bm.allocate(65)


@needs_ops
def test_stop_string_and_streaming(llms):
    llm = llms("qwen2")
    full = llm.generate("The quick brown", SamplingParams(max_tokens=24, ignore_eos=True))[0]
    assert len(full.text) > 6
    stop = full.text[3:6]
    chunks: list[str] = []
    out = llm.generate(
        "The quick brown",
        SamplingParams(max_tokens=24, stop=[stop], ignore_eos=True),
        stream=lambda i, delta: chunks.append(delta),
    )[0]
    assert out.finish_reason == "stop"
    assert out.text == full.text[: full.text.find(stop)] == "".join(chunks)
    assert out.ttft_s <= out.total_s


@needs_ops
def test_eos_stops_generation(llms):
    llm = llms("llama")
    free = llm.generate("The quick brown", SamplingParams(max_tokens=12, ignore_eos=True))[0]
    eos = free.token_ids[4]
    llm.llm_engine.eos_token_ids = frozenset({eos})
    try:
        out = llm.generate("The quick brown", SamplingParams(max_tokens=12))[0]
    finally:
        llm.llm_engine.eos_token_ids = frozenset(llm.tokenizer.eos_token_ids)
    assert out.finish_reason == "stop" and out.token_ids == free.token_ids[: free.token_ids.index(eos) + 1]


@needs_ops
def test_chat_uses_template(llms):
    llm = llms("smollm2")
    out = llm.chat([{"role": "user", "content": "Hello"}], SamplingParams(max_tokens=4, ignore_eos=True))[0]
    assert out.prompt_token_ids == llm.tokenizer.encode_chat([{"role": "user", "content": "Hello"}])
    assert len(out.token_ids) == 4


@needs_ops
def test_interrupted_generate_frees_blocks(llms):
    llm = llms("llama")

    def boom(_i: int, _delta: str) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        llm.generate(["The quick brown", "fox"], SamplingParams(max_tokens=8, ignore_eos=True), stream=boom)
    bm = llm.llm_engine.scheduler.block_manager
    assert bm.num_free == bm.num_blocks > 0
