"""Fair admission (keel.engine.scheduler's module doc states the bound): a new client's first token while
another client holds every slot, a short prompt behind long ones in chunked prefill, and the `n` choices of
one prompt computing it (and its prompt logprobs) once. Steps are counted, not seconds; the step's budget is
in token-equivalents (a token's projections plus its attention, engine.scheduler.cost)."""

from __future__ import annotations

import math

import pytest
from support.native import needs_ops

from keel.engine import LLMEngine, SamplingParams
from keel.engine.scheduler import water_fill

pytestmark = needs_ops
TEXT = "The quick brown fox jumps over the lazy dog. Paged attention stores keys and values in fixed-size blocks. "
SLOTS, BUDGET = 4, 16  # per client and step, a new client's prompt gets at least (BUDGET - SLOTS) // clients
# token-equivalents, so at least that divided by its last token's cost in tokens


def make(**kw) -> LLMEngine:
    kw = {"max_num_seqs": SLOTS, "max_num_batched_tokens": BUDGET, "block_size": 16, **kw}
    return LLMEngine("keel-test/tiny-llama", dtype="float32", device="cpu", progress=False, **kw)


@pytest.fixture(scope="module")
def engine(hf_cache) -> LLMEngine:
    return make()


def prompt(engine: LLMEngine, n: int) -> list[int]:
    ids = engine.tokenizer.encode(TEXT * 8)
    assert len(ids) >= n
    return ids[:n]


def bound(engine: LLMEngine, length: int, clients: int) -> int:
    """The module doc's bound: steps within which a new client's `length`-token prompt has its first token."""
    share = (BUDGET - SLOTS) // clients
    per_step = max(1, math.floor(share / engine.scheduler.cost.chunk(length - 1, 1)))
    return math.ceil(length / per_step)


def steps_to_first_token(engine: LLMEngine, rid: str, limit: int = 200) -> int:
    """Step until `rid` has its first token; how many steps that took."""
    for n in range(1, limit + 1):
        if any(o.request_id == rid and o.token_ids for o in engine.step()):
            return n
    raise AssertionError(f"{rid} had no token after {limit} steps")


def drain(engine: LLMEngine) -> dict:
    final = {}
    while engine.has_unfinished_requests():
        final.update({o.request_id: o for o in engine.step() if o.finished})
    return final


def test_water_fill_is_max_min_fair():
    assert water_fill([100, 3, 100], 30) == [13, 3, 14]  # the small demand is met, the rest split evenly
    assert water_fill([5, 5], 100) == [5, 5] and water_fill([], 7) == []
    assert sum(water_fill([9, 1, 40, 7], 20)) == 20


@pytest.mark.parametrize("length", [6, 20], ids=["within-one-step", "chunked"])
def test_a_new_client_gets_its_first_token_within_the_bound_while_another_holds_every_slot(engine, length):
    long = SamplingParams(max_tokens=40, ignore_eos=True)
    for i in range(SLOTS):
        engine.add_request(f"a{i}", prompt(engine, 8), long, client="a")
    for _ in range(3):
        engine.step()
    assert engine.metrics().num_running == SLOTS  # client a holds every slot, decoding
    engine.add_request("b", prompt(engine, length), SamplingParams(max_tokens=2, ignore_eos=True), client="b")
    assert steps_to_first_token(engine, "b") <= bound(engine, length, 2)
    running = [s.client for s in engine.scheduler.running]
    assert running.count("a") == SLOTS - 1 and running.count("b") == 1  # one of a's sequences made room
    for rid in [f"a{i}" for i in range(SLOTS)] + ["b"]:  # (the preempted one's recompute: the test below)
        engine.abort_request(rid, report=False)


def test_a_new_client_gets_its_first_token_at_the_next_step_while_another_holds_every_block(hf_cache):
    probe = make()
    engine = make(max_kv_cache_bytes=9 * probe.runner.kv_bytes_per_block())  # 3 sequences of 48 tokens
    long = SamplingParams(max_tokens=50, ignore_eos=True)
    for i in range(SLOTS):
        engine.add_request(f"a{i}", prompt(engine, 8 + i), long, client="a")
    for _ in range(30):
        engine.step()
    m = engine.metrics()
    assert m.kv_blocks_used == m.kv_blocks_total and m.num_preemptions  # client a is short of blocks already
    engine.add_request("b", prompt(engine, 6), SamplingParams(max_tokens=2, ignore_eos=True), client="b")
    assert steps_to_first_token(engine, "b") == 1
    assert [s.client for s in engine.scheduler.running].count("b") == 1


def test_preempted_client_gets_the_same_tokens(engine):
    """A sequence preempted for another client's admission is recomputed to the tokens it gets alone."""
    greedy = SamplingParams(max_tokens=20, ignore_eos=True)
    alone = {}
    for i in range(SLOTS):
        engine.add_request(f"x{i}", prompt(engine, 10 + i), greedy)
        alone.update(drain(engine))
    for i in range(SLOTS):
        engine.add_request(f"y{i}", prompt(engine, 10 + i), greedy, client="a")
    engine.step()
    engine.add_request("z", prompt(engine, 5), greedy, client="b")
    preemptions = engine.metrics().num_preemptions
    final = drain(engine)
    assert engine.metrics().num_preemptions > preemptions
    assert [final[f"y{i}"].token_ids for i in range(SLOTS)] == [alone[f"x{i}"].token_ids for i in range(SLOTS)]


@pytest.mark.parametrize("clients", ["one", "two"])
def test_a_short_prompt_behind_six_long_ones_gets_its_first_token_at_the_next_step(hf_cache, clients):
    engine = make(max_num_seqs=8)
    for i in range(6):
        engine.add_request(f"long{i}", prompt(engine, 120), SamplingParams(max_tokens=1), client="a")
    engine.step()
    short = prompt(engine, 6)  # (its 6 tokens cost less than half the budget: one step with two clients too)
    engine.add_request("short", short, SamplingParams(max_tokens=1), client="a" if clients == "one" else "b")
    assert steps_to_first_token(engine, "short") == 1
    assert all(s.num_computed_tokens < 120 for s in engine.scheduler.running)  # the long ones still prefill
    drain(engine)


def test_two_clients_with_long_prompts_each_get_half_of_every_step(hf_cache):
    engine = make(max_num_seqs=8)
    for i in range(6):
        engine.add_request(f"long{i}", prompt(engine, 120), SamplingParams(max_tokens=1), client="a")
    engine.step()
    other = prompt(engine, 60)[::-1]  # (no prefix-cache hit on a's prompts)
    engine.add_request("b", other, SamplingParams(max_tokens=1), client="b")
    cost, half, steps = engine.scheduler.cost, BUDGET // 2, 0
    done = {id(s): s.num_computed_tokens for s in engine.scheduler.running}
    while not any(o.request_id == "b" for o in engine.step()):
        steps += 1
        spent, more = dict.fromkeys("ab", 0.0), dict.fromkeys("ab", 0.0)
        for s in engine.scheduler.running:  # each client's chunks this step, in token-equivalents
            start = done.get(id(s), 0)
            spent[s.client] += cost.chunk(start, s.num_computed_tokens - start)
            more[s.client] = max(more[s.client], cost.chunk(s.num_computed_tokens, 1))  # one more token's cost
            done[id(s)] = s.num_computed_tokens
        assert all(half - more[c] < spent[c] <= half for c in "ab"), spent  # half of each step each
    assert steps + 1 <= bound(engine, 60, 2)
    drain(engine)


@pytest.mark.parametrize("prompt_logprobs", [None, 3])
def test_n_choices_compute_their_prompt_once(hf_cache, prompt_logprobs):
    engine = make(max_num_seqs=8, max_num_batched_tokens=256)
    ids, n = prompt(engine, 100), 8
    params = SamplingParams(max_tokens=4, ignore_eos=True, prompt_logprobs=prompt_logprobs)
    for i in range(n):
        engine.add_request(f"c{i}", ids, params)
    choices = drain(engine)
    tail = len(ids) - (len(ids) - 1) // 16 * 16  # what each twin computes past the shared full blocks
    assert engine.stats.prefill_tokens == len(ids) + (n - 1) * tail
    engine.add_request("alone", ids, params)
    alone = drain(engine)["alone"]
    assert all(choices[f"c{i}"].token_ids == alone.token_ids for i in range(n))
    if prompt_logprobs is not None:
        assert len(alone.prompt_logprobs) == len(ids)
        assert all(choices[f"c{i}"].prompt_logprobs == alone.prompt_logprobs for i in range(n))
