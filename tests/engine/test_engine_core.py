"""`LLMEngine` over 16-token blocks (the paged attention kernels): greedy tokens against transformers,
request validation, continuous batching, abort, preemption under a small KV pool, and prefix caching
(identical greedy tokens with and without it; a chat's second turn served from cache)."""

from __future__ import annotations

import pytest
from keel_dev.parity import assert_greedy_parity, reference_greedy
from support.native import needs_ops

from keel.engine import LLM, LLMEngine, SamplingParams

pytestmark = needs_ops
PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention stores keys and values in fixed-size blocks.",
    "def f(x):",
]
GREEDY = SamplingParams(max_tokens=20, ignore_eos=True)


def make_engine(arch: str = "llama", cls: type = LLM, **kw):
    return cls(f"keel-test/tiny-{arch}", dtype="float32", device="cpu", block_size=16, progress=False, **kw)


@pytest.fixture(scope="module")
def engines(hf_cache):
    """One block-16 `LLM` per arch, shared by this module's tests."""
    loaded: dict[str, LLM] = {}

    def get(arch: str) -> LLM:
        if arch not in loaded:
            loaded[arch] = make_engine(arch)
        return loaded[arch]

    return get


def run_to_end(engine: LLMEngine, trace: list | None = None) -> dict:
    """Step until idle; the final output of each request (and every step's outputs in `trace`)."""
    final = {}
    while engine.has_unfinished_requests():
        outs = engine.step()
        if trace is not None:
            trace.append(outs)
        final.update({o.request_id: o for o in outs if o.finished})
    return final


@pytest.fixture(scope="module")
def alone(engines) -> list[list[int]]:
    """Greedy tokens of each prompt run by itself."""
    llm = engines("llama")
    return [llm.generate(p, GREEDY)[0].token_ids for p in PROMPTS]


@pytest.mark.parametrize("arch", ["llama", "smollm2", "qwen3", "mistral"])
def test_paged_kernels_greedy_match_transformers(arch, engines, hf_models):
    llm, hf = engines(arch), hf_models(arch)
    ids = llm.tokenizer.encode(PROMPTS[1])  # 40 new tokens: the context crosses 16-token blocks
    out = llm.generate([ids], SamplingParams(max_tokens=40, ignore_eos=True))[0]
    # greedy by full recomputation on the reference side; equal up to its first near-tie (fp32: 2e-3,
    # 10x twice the logit bound of tests/engine/test_models_parity.py)
    assert_greedy_parity(out.token_ids, *reference_greedy(hf, ids, 40), 2e-3, f"{arch} paged keel vs transformers")


def test_add_request_rejects_bad_input(engines):
    engine = engines("llama").llm_engine
    with pytest.raises(ValueError, match="request 'e' is empty"):
        engine.add_request("e", [], GREEDY)
    with pytest.raises(ValueError, match=r"outside \[0, \d+\) \(the vocabulary\)"):
        engine.add_request("v", [1, engine.config.vocab_size], GREEDY)
    with pytest.raises(ValueError, match="context is 128 tokens"):
        engine.add_request("c", [5] * 128, GREEDY)
    engine.add_request("dup", "fox", GREEDY)
    try:
        with pytest.raises(ValueError, match="'dup' is already in use"):
            engine.add_request("dup", "fox", GREEDY)
    finally:
        engine.abort_request("dup")
    assert engine.step()[0].finish_reason == "abort" and not engine.has_unfinished_requests()


def test_streamed_deltas_add_up(engines):
    engine = engines("qwen2").llm_engine
    engine.add_request("s", PROMPTS[0], SamplingParams(max_tokens=12, ignore_eos=True))
    trace: list = []
    final = run_to_end(engine, trace)["s"]
    outs = [o for step in trace for o in step]
    assert "".join(o.delta_text for o in outs) == final.text
    assert [t for o in outs for t in o.new_token_ids] == final.token_ids and len(final.token_ids) == 12
    assert final.finish_reason == "length" and [o.finished for o in outs].count(True) == 1


def test_request_added_mid_decode_joins_the_batch(engines, alone):
    engine = engines("llama").llm_engine
    engine.add_request("a", PROMPTS[0], GREEDY)
    trace: list = []
    for _ in range(4):
        trace.append(engine.step())
    engine.add_request("b", PROMPTS[1], GREEDY)
    final = run_to_end(engine, trace)
    joined = [{o.request_id for o in step} for step in trace]
    assert {"a", "b"} in joined  # some step produced tokens for both: b joined while a was decoding
    assert final["a"].token_ids == alone[0] and final["b"].token_ids == alone[1]


def test_abort_frees_blocks(engines):
    engine = engines("llama").llm_engine
    bm = engine.scheduler.block_manager
    for i, p in enumerate(PROMPTS):
        engine.add_request(f"x{i}", p, GREEDY)
    engine.step()
    engine.step()
    assert bm.num_used > 0 and engine.metrics().num_running == 3
    for i in range(3):
        engine.abort_request(f"x{i}")
    engine.abort_request("x0")  # twice, and unknown ids: no-ops
    engine.abort_request("never-added")
    assert bm.num_used == 0 and bm.num_free == bm.num_blocks
    outs = engine.step()
    assert sorted(o.request_id for o in outs) == ["x0", "x1", "x2"]
    assert all(o.finished and o.finish_reason == "abort" for o in outs)
    assert not engine.has_unfinished_requests() and engine.step() == []


def test_preemption_keeps_greedy_tokens(alone):
    probe = make_engine(cls=LLMEngine)
    per_block = probe.runner.kv_bytes_per_block()
    biggest = max(probe.scheduler.block_manager.blocks_for(len(probe.tokenizer.encode(p)) + 20) for p in PROMPTS)
    engine = make_engine(cls=LLMEngine, max_kv_cache_bytes=(biggest + 1) * per_block)  # room for one and a bit
    for i, p in enumerate(PROMPTS):
        engine.add_request(str(i), p, GREEDY)
    final = run_to_end(engine)
    m = engine.metrics()
    assert m.num_preemptions > 0 and m.kv_blocks_total == biggest + 1
    assert [final[str(i)].token_ids for i in range(3)] == alone
    assert m.kv_blocks_used == 0 and m.num_running == m.num_waiting == 0


def test_prefix_is_looked_up_once_per_admission(engines, monkeypatch):
    """The scheduler computes each waiting sequence's prefix-cache hit once and allocates with it."""
    llm = engines("llama")
    bm = llm.llm_engine.scheduler.block_manager
    calls: list[int] = []
    real = bm.cached_prefix
    monkeypatch.setattr(bm, "cached_prefix", lambda ids: calls.append(len(ids)) or real(ids))
    outs = llm.generate(PROMPTS, GREEDY)
    assert sorted(calls) == sorted(len(o.prompt_token_ids) for o in outs)  # one lookup per prompt


def test_prefix_caching_same_tokens_as_without(engines):
    cached = engines("llama")
    plain = make_engine(enable_prefix_caching=False)
    shared = PROMPTS[1] + " " + PROMPTS[0] + " "
    prompts = [shared + "Hello", shared + "The quick", shared + "def"]
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    want = [o.token_ids for o in plain.generate(prompts, params)]
    first = cached.generate(prompts[:1], params)[0]
    rest = cached.generate(prompts, params)
    assert [o.token_ids for o in rest] == want and first.token_ids == want[0]
    assert all(o.num_cached_tokens >= 16 for o in rest)  # the shared prefix came from the cache
    assert plain.generate(prompts[:1], params)[0].num_cached_tokens == 0
    assert plain.llm_engine.metrics().prefix_cache_hits == 0 < cached.llm_engine.metrics().prefix_cache_hits


def test_second_chat_turn_is_served_from_cache(engines):
    llm = engines("smollm2")
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    conv = [{"role": "user", "content": "Hello world! Numbers 0123456789 and unicode: café, naïve."}]
    first = llm.chat(conv, params)[0]
    conv += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "again"}]
    second = llm.chat(conv, params)[0]
    full_blocks = len(first.prompt_token_ids) // 16 * 16
    assert second.num_cached_tokens >= full_blocks > 0  # at least turn 1's full blocks
    plain = make_engine("smollm2", enable_prefix_caching=False)
    assert plain.chat(conv, params)[0].token_ids == second.token_ids


def test_generate_from_several_threads_takes_turns(engines, alone):
    """Concurrent `LLM.generate` callers each get their own prompts' tokens, as if run alone."""
    import threading

    llm = engines("llama")
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def worker(i: int) -> None:
        try:
            start.wait()
            results[i] = llm.generate(PROMPTS[i], GREEDY)[0].token_ids
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert [results[i] for i in range(3)] == alone
    assert not llm.llm_engine.has_unfinished_requests() and llm.llm_engine.metrics().kv_blocks_used == 0


def test_second_thread_inside_the_engine_is_refused(engines, monkeypatch):
    """A thread that calls step / add / abort while another is inside step gets a clear error; nothing leaks."""
    import threading

    engine = engines("llama").llm_engine
    inside, release = threading.Event(), threading.Event()
    real_run = engine.runner.run

    def slow_run(batch):
        inside.set()
        release.wait(60)
        return real_run(batch)

    monkeypatch.setattr(engine.runner, "run", slow_run)
    engine.add_request("t0", PROMPTS[0], SamplingParams(max_tokens=2, ignore_eos=True))
    stepper = threading.Thread(target=engine.step, name="stepper")
    stepper.start()
    try:
        assert inside.wait(60)
        for call in (engine.step, lambda: engine.add_request("t1", "fox", GREEDY), lambda: engine.abort_request("t0")):
            with pytest.raises(RuntimeError, match=r"LLMEngine\.\w+: called from thread .* while thread 'stepper'"):
                call()
    finally:
        release.set()
        stepper.join(60)
    monkeypatch.undo()
    final = run_to_end(engine)
    assert final["t0"].token_ids == alone_tokens(engine, PROMPTS[0], 2)
    assert engine.metrics().kv_blocks_used == 0


def alone_tokens(engine: LLMEngine, prompt: str, n: int) -> list[int]:
    engine.add_request("alone", prompt, SamplingParams(max_tokens=n, ignore_eos=True))
    return run_to_end(engine)["alone"].token_ids
