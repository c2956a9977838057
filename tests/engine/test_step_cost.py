"""The step budget counts attention (keel.engine.scheduler.StepCost): a late chunk of a long prompt is smaller
than an early one, a step's cost stays within max_num_batched_tokens token-equivalents, every client with
prompt work still gets a token a step, and the engine derives the break-even context from the model's config.
Scheduler-level tests drive the scheduler alone (no model); one engine-level test loads the tiny checkpoint."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from support.native import needs_ops

from keel.engine import LLMEngine, SamplingParams
from keel.engine.model_runner import CPU_ATTENTION_SPEED, step_cost
from keel.engine.scheduler import Scheduler, StepCost
from keel.engine.sequence import Sequence

# SmolLM2-135M's shape: a token's attention FLOPs equal its projections' at 3,072 positions (a third of that on a CPU)
SMOLLM2 = SimpleNamespace(
    hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3, head_dim=64
)
K = step_cost(SMOLLM2, "cuda").break_even  # from FLOPs alone (the scheduler's tests take it as given)
BUDGET, SLOTS = 256, 8


def scheduler(cost: StepCost | None = None, budget: int = BUDGET, slots: int = SLOTS) -> Scheduler:
    return Scheduler(block_size=16, max_num_seqs=slots, max_num_batched_tokens=budget, max_num_blocks=4096, cost=cost)


def seq(n: int, client: str | None = None, first: int = 0, max_tokens: int = 4) -> Sequence:
    """An `n`-token prompt of distinct tokens from `first` (no prefix-cache hit on another's)."""
    ids = list(range(first, first + n))
    return Sequence(None, ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True), n + max_tokens, client=client)


def step(sched: Scheduler) -> dict[Sequence, tuple[int, int]]:
    """One step without a model: each scheduled sequence's (start, tokens); a completed prompt gets token 0."""
    out = sched.schedule()
    work = {s: (s.num_computed_tokens, n) for s, n in zip(out.seqs, out.num_tokens, strict=True)}
    done = [out.completes(r) for r in range(len(out.seqs))]
    for r, s in enumerate(out.seqs):
        sched.commit(s, out.num_tokens[r])
        if done[r]:
            s.token_ids.append(0)
    return work


def prefill(sched: Scheduler, seqs: list[Sequence], upto: int, limit: int = 1000) -> None:
    """Step until every one of `seqs` has `upto` tokens computed (a stuck scheduler fails, not hangs)."""
    for _ in range(limit):
        if all(s.num_computed_tokens >= upto for s in seqs):
            return
        step(sched)
    raise AssertionError(f"no progress: {[s.num_computed_tokens for s in seqs]} after {limit} steps")


def cost_of(sched: Scheduler, work: dict[Sequence, tuple[int, int]]) -> float:
    return sum(sched.cost.chunk(start, n) for start, n in work.values())


def test_the_break_even_comes_from_the_models_shape():
    assert K == pytest.approx(3072.0)  # 2 x 3,538,944 weights a layer / (4 x 9 heads x 64)
    assert step_cost(SMOLLM2).break_even == pytest.approx(K * CPU_ATTENTION_SPEED)  # attention's speed on a CPU
    assert step_cost(SimpleNamespace(hidden_size=576)) == StepCost()  # numbers missing: tokens only
    assert step_cost(SimpleNamespace(**vars(SMOLLM2), sliding_window=4096)).window == 4096
    cost = StepCost(K)
    assert cost.chunk(0, 256) == pytest.approx(256 * (1 + 128.5 / K))  # n x (1 + (p + (n + 1) / 2) / K)
    assert cost.chunk(7744, 256) > 2.2 * cost.chunk(0, 256) / 1.05
    assert StepCost(K, window=100).chunk(7744, 256) == pytest.approx(256 * (1 + 100 / K))  # capped attention
    assert StepCost().chunk(7744, 256) == 256 and StepCost().fit(7744, 1000, 256.5) == 256
    with pytest.raises(ValueError, match="StepCost: break_even"):
        StepCost(0.0)


def test_a_late_chunk_of_a_long_prompt_is_smaller_and_every_step_stays_within_the_budget():
    sched = scheduler(StepCost(K))
    long = seq(8000)
    sched.add(long)
    chunks = []
    for _ in range(200):
        if long.num_computed_tokens == 8000:
            break
        work = step(sched)
        assert cost_of(sched, work) <= BUDGET
        chunks.append(work[long][1])
    assert sum(chunks) == 8000
    assert chunks == sorted(chunks, reverse=True)  # each chunk starts later: never larger
    assert chunks[0] >= 240 and chunks[-2] <= 90  # the last full chunk attends to ~7,900 positions
    # without the cost model every chunk is the whole budget, however late
    plain = scheduler()
    plain.add(seq(8000))
    assert {n for _, n in step(plain).values()} == {BUDGET}


def test_decodes_are_charged_their_context():
    sched = scheduler(StepCost(K), slots=16)
    decoding = [seq(6000, client=f"d{i}", first=10_000 * (i + 1), max_tokens=50) for i in range(4)]
    for s in decoding:  # computed as if earlier: their next step decodes at context 6,000
        sched.add(s)
    prefill(sched, decoding, 6000)
    long = seq(3000, client="p")
    sched.add(long)
    work = step(sched)
    assert all(work[s][1] == 1 for s in decoding)
    assert cost_of(sched, work) <= BUDGET
    decode_cost = sum(sched.cost.chunk(s.num_computed_tokens - 1, 1) for s in decoding)
    assert work[long][1] == sched.cost.fit(0, 3000, BUDGET - math.ceil(decode_cost))


def test_prompt_budget_keeps_the_fairness_share_when_decodes_cost_more_than_the_slots():
    """S decodes at a huge context would leave prompts nothing: they are charged at most S, so a prompt
    still gets B - S token-equivalents (the fairness bound's share)."""
    sched = scheduler(StepCost(8.0), budget=32, slots=4)
    decoding = [seq(200, client=f"d{i}", first=1000 * (i + 1), max_tokens=50) for i in range(3)]
    for s in decoding:
        sched.add(s)
    prefill(sched, decoding, 200)
    new = seq(40, client="b")
    sched.add(new)
    work = step(sched)
    assert sum(sched.cost.chunk(*work[s]) for s in decoding) > 3 * 26  # each decode attends to 200+ positions
    assert work[new][1] == StepCost(8.0).fit(0, 40, 32 - 4)  # 28 equivalents, not 32 - 78


def test_every_client_with_prompt_work_gets_a_token_a_step():
    """A grant smaller than one late token's cost still computes that token (progress)."""
    sched = scheduler(StepCost(10.0), budget=4, slots=2)
    a, b = seq(300, client="a"), seq(300, client="b", first=1000)
    sched.add(a)
    sched.add(b)
    for _ in range(40):
        work = step(sched)
        assert work[a][1] >= 1 and work[b][1] >= 1
    assert a.num_computed_tokens >= 40 and b.num_computed_tokens >= 40


def test_two_clients_split_a_step_in_equivalents():
    """An early and a late prompt of two clients: each gets half the budget's cost, so the late one fewer
    tokens."""
    sched = scheduler(StepCost(K))
    late = seq(8000, client="a")
    sched.add(late)
    prefill(sched, [late], 6000)
    early = seq(1000, client="b", first=20_000)
    sched.add(early)
    work = step(sched)
    half = BUDGET // 2
    for s in (late, early):
        start, n = work[s]
        assert half - sched.cost.chunk(start + n, 1) < sched.cost.chunk(start, n) <= half
    assert work[early][1] > 2 * work[late][1]


@needs_ops
def test_the_engine_charges_the_loaded_models_attention(hf_cache):
    engine = LLMEngine(
        "keel-test/tiny-llama", dtype="float32", device="cpu", progress=False, max_num_batched_tokens=16, max_num_seqs=4
    )
    cost = engine.scheduler.cost
    assert cost.break_even == step_cost(engine.config).break_even and cost.break_even is not None
    ids = engine.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 40)[:120]
    engine.add_request("long", ids, SamplingParams(max_tokens=1))
    chunks = []
    while engine.has_unfinished_requests():
        before = engine.scheduler.running[0].num_computed_tokens if engine.scheduler.running else 0
        engine.step()
        if engine.scheduler.running:
            chunks.append(engine.scheduler.running[0].num_computed_tokens - before)
    assert chunks[0] == cost.fit(0, 120, 16) and chunks[-1] < chunks[0]
    assert sum(chunks) < 120  # (the last chunk finished the request)
