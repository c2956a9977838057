"""The sampling extras on the engine side, on the tiny checkpoints (fp32): logprobs and prompt logprobs against the
model's own logits and transformers', scoring requests, min_tokens / stop_token_ids / bias / allowed / bad words /
special tokens through the engine, and n / best_of."""

from __future__ import annotations

import math

import pytest
import torch
from keel_dev.engine import keel_prompt_logits
from support.native import needs_ops

from keel.engine import SamplingParams
from keel.engine.sampling_params import bad_words_token_ids

pytestmark = needs_ops
PROMPT = "The quick brown fox"


def test_logprobs_are_log_softmax_of_the_models_logits(llms):
    llm = llms("llama")
    out = llm.generate(PROMPT, SamplingParams(max_tokens=6, ignore_eos=True, logprobs=5))[0]
    ids = out.prompt_token_ids + out.token_ids
    lp = torch.log_softmax(keel_prompt_logits(llm, ids).float(), -1)  # one pass over prompt + output
    n = len(out.prompt_token_ids)
    assert len(out.logprobs) == len(out.token_ids) == 6
    total = 0.0
    for t, (tok, entry) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
        row = lp[n - 1 + t]
        assert abs(entry[tok].logprob - row[tok].item()) < 1e-4
        assert entry[tok].rank == 1  # greedy: the sampled token is the most likely
        top = row.topk(5)
        assert list(entry) == top.indices.tolist()  # the sampled token is the top one here, so 5 entries
        for rank, (tid, v) in enumerate(zip(top.indices.tolist(), top.values.tolist(), strict=True), start=1):
            assert abs(entry[tid].logprob - v) < 1e-4 and entry[tid].rank == rank
            assert entry[tid].decoded_token == llm.tokenizer.decode([tid], skip_special_tokens=False)
        total += entry[tok].logprob
    assert math.isclose(out.cumulative_logprob, total, abs_tol=1e-5)


def test_sampled_logprobs_are_raw_even_with_temperature_and_penalties(llms):
    llm = llms("qwen2")
    params = SamplingParams(
        max_tokens=5, ignore_eos=True, temperature=1.3, seed=3, presence_penalty=1.0, logit_bias={9: 3.0}, logprobs=1
    )
    out = llm.generate(PROMPT, params)[0]
    lp = torch.log_softmax(keel_prompt_logits(llm, out.prompt_token_ids + out.token_ids).float(), -1)
    n = len(out.prompt_token_ids)
    for t, (tok, entry) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
        assert abs(entry[tok].logprob - lp[n - 1 + t, tok].item()) < 1e-4
        assert entry[tok].rank == int((lp[n - 1 + t] > lp[n - 1 + t, tok]).sum()) + 1


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_prompt_logprobs_match_transformers(arch, llms, hf_models):
    llm, hf = llms(arch), hf_models(arch)
    ids = llm.tokenizer.encode("Pack my box with five dozen liquor jugs")
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
    for attempt in range(2):  # the second time the prompt's blocks are in the prefix cache
        out = llm.generate([ids], SamplingParams(max_tokens=0, prompt_logprobs=2))[0]
        assert out.token_ids == [] and out.finish_reason == "length" and out.text == ""
        plp = out.prompt_logprobs
        assert len(plp) == len(ids) and plp[0] is None
        for i in range(1, len(ids)):
            entry = plp[i]
            assert abs(entry[ids[i]].logprob - ref[i - 1, ids[i]].item()) < 1e-3, (attempt, i)
            top = ref[i - 1].topk(2).indices.tolist()
            assert all(t in entry for t in top) and entry[top[0]].rank == 1


def test_prompt_logprobs_with_generation_and_neighbours(llms):
    """A prompt_logprobs request batched with plain ones: its prompt entries, everyone's tokens unchanged."""
    llm = llms("llama")
    prompts = [PROMPT, "Sphinx of black quartz", "How vexingly quick"]
    plain = llm.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True))
    mixed = llm.generate(
        prompts,
        [SamplingParams(max_tokens=4, ignore_eos=True, prompt_logprobs=0 if i == 1 else None) for i in range(3)],
    )
    assert [o.token_ids for o in mixed] == [o.token_ids for o in plain]
    assert mixed[0].prompt_logprobs is None and mixed[2].prompt_logprobs is None
    plp = mixed[1].prompt_logprobs
    ids = mixed[1].prompt_token_ids
    assert len(plp) == len(ids) and all(len(plp[i]) in (1, 2) and ids[i] in plp[i] for i in range(1, len(ids)))


def test_stop_token_ids_and_include_stop_str(llms):
    llm = llms("llama")
    free = llm.generate(PROMPT, SamplingParams(max_tokens=12, ignore_eos=True))[0]
    tok = free.token_ids[3]
    first = free.token_ids.index(tok)
    out = llm.generate(PROMPT, SamplingParams(max_tokens=12, stop_token_ids=[tok]))[0]
    assert out.finish_reason == "stop" and out.token_ids == free.token_ids[: first + 1]
    assert out.text == llm.tokenizer.decode(free.token_ids[:first])
    kept = llm.generate(PROMPT, SamplingParams(max_tokens=12, stop_token_ids=[tok], include_stop_str_in_output=True))[0]
    assert kept.text == llm.tokenizer.decode(free.token_ids[: first + 1])


def test_min_tokens_masks_stop_tokens_before_it(llms):
    llm = llms("llama")
    free = llm.generate(PROMPT, SamplingParams(max_tokens=12, ignore_eos=True))[0]
    tok = free.token_ids[0]
    assert llm.generate(PROMPT, SamplingParams(max_tokens=12, stop_token_ids=[tok]))[0].token_ids == [tok]
    out = llm.generate(PROMPT, SamplingParams(max_tokens=12, stop_token_ids=[tok], min_tokens=5))[0]
    assert tok not in out.token_ids[:5] and len(out.token_ids) >= 5
    assert out.finish_reason == "length" or out.token_ids[-1] == tok


def test_logit_bias_allowed_and_bad_words_through_the_engine(llms):
    llm = llms("qwen2")
    forced = llm.generate(PROMPT, SamplingParams(max_tokens=5, ignore_eos=True, logit_bias={17: 100.0}))[0]
    assert forced.token_ids == [17] * 5
    allowed = llm.generate(
        PROMPT, SamplingParams(max_tokens=8, ignore_eos=True, temperature=1.0, seed=0, allowed_token_ids=[40, 41])
    )[0]
    assert set(allowed.token_ids) <= {40, 41}
    free = llm.generate(PROMPT, SamplingParams(max_tokens=10, ignore_eos=True))[0]
    word = llm.tokenizer.decode([free.token_ids[1]]).strip()
    assert word
    banned = llm.generate(PROMPT, SamplingParams(max_tokens=10, ignore_eos=True, bad_words=[word]))[0]
    tok = llm.llm_engine.tokenizer
    for seq in bad_words_token_ids([word], lambda texts: tok.encode_batch(texts, add_special_tokens=False)):
        n = len(seq)
        assert all(banned.token_ids[i : i + n] != seq for i in range(len(banned.token_ids))), (word, seq)
    with pytest.raises(ValueError, match=r"logit_bias of prompt 0 has token ids \[99999\] outside"):
        llm.generate(PROMPT, SamplingParams(logit_bias={99999: 1.0}))


def test_skip_special_tokens(llms):
    llm = llms("llama")
    special = llm.tokenizer._tok.token_to_id("<|im_start|>")
    params = dict(max_tokens=3, ignore_eos=True, logit_bias={special: 100.0})
    assert llm.generate(PROMPT, SamplingParams(**params))[0].text == ""
    assert llm.generate(PROMPT, SamplingParams(**params, skip_special_tokens=False))[0].text == "<|im_start|>" * 3


def test_n_completions_and_best_of(llms):
    llm = llms("qwen2")
    base = dict(max_tokens=8, ignore_eos=True, temperature=1.0)
    res = llm.generate([PROMPT, "Sphinx of"], SamplingParams(**base, n=3, seed=11))
    assert len(res) == 2 and all(len(r.outputs) == 3 for r in res)
    assert [o.index for o in res[0].outputs] == [0, 1, 2] and res[0].token_ids == res[0].outputs[0].token_ids
    assert len({tuple(o.token_ids) for o in res[0].outputs}) > 1  # distinct seeds per candidate
    # each candidate c is the n=1 request with seed + c
    alone = [llm.generate(PROMPT, SamplingParams(**base, seed=11 + c, logprobs=0))[0] for c in range(4)]
    assert [o.token_ids for o in res[0].outputs] == [a.token_ids for a in alone[:3]]
    best = llm.generate(PROMPT, SamplingParams(**base, n=2, best_of=4, seed=11))[0]
    ranked = sorted(alone, key=lambda a: a.cumulative_logprob, reverse=True)[:2]
    assert [o.token_ids for o in best.outputs] == [a.token_ids for a in ranked]
    got = [o.cumulative_logprob for o in best.outputs]
    assert got == sorted(got, reverse=True)
    for o, a in zip(best.outputs, ranked, strict=True):
        assert math.isclose(o.cumulative_logprob, a.cumulative_logprob, abs_tol=1e-5)
    single = llm.generate(PROMPT, SamplingParams(max_tokens=3))[0]
    assert len(single.outputs) == 1 and single.outputs[0].token_ids == single.token_ids
    with pytest.raises(ValueError, match="stream needs n == 1"):
        llm.generate(PROMPT, SamplingParams(n=2), stream=lambda i, d: None)


def test_scoring_request_may_fill_the_context(llms):
    llm = llms("llama")
    limit = llm.config.max_position_embeddings
    ids = (llm.tokenizer.encode(PROMPT * 40) * 4)[:limit]
    out = llm.generate([ids], SamplingParams(max_tokens=0, prompt_logprobs=0))[0]
    assert len(out.prompt_logprobs) == limit and out.token_ids == []
    with pytest.raises(ValueError, match=f"at most {limit - 1} prompt tokens fit"):
        llm.generate([ids], SamplingParams(max_tokens=1))
