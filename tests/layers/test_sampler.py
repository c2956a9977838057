"""The batched sampler on fake logits: each processor against a hand-computed reference, logprobs against
log_softmax of the raw logits, and rows that ask for nothing left alone."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from keel.layers.sampler import (
    NOT_FINITE,
    NOTHING_ALLOWED,
    apply_masks,
    apply_min_p,
    apply_penalties,
    greedy,
    sample,
    unpack_bitmask,
)


@dataclass
class P:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    logprobs: int | None = None


V = 8
BASE = torch.tensor([2.0, -1.0, 0.5, 3.0, -2.0, 1.0, 0.0, -0.5])


def rows(n: int = 2) -> torch.Tensor:
    return BASE.repeat(n, 1).clone()


def test_presence_and_frequency_penalties_use_output_counts_only():
    logits = rows()
    # row 0: prompt [3, 0], output [0, 0, 5]; row 1 untouched (no penalty)
    apply_penalties(
        logits, [P(presence_penalty=0.5, frequency_penalty=0.25), P()], [[3, 0, 0, 0, 5], [3, 0]], num_prompt=[2, 2]
    )
    want = BASE.clone()
    want[0] -= 0.5 + 0.25 * 2  # output count 2
    want[5] -= 0.5 + 0.25 * 1
    # token 3 is in the prompt only: OpenAI's penalties leave it alone
    assert torch.equal(logits[0], want)
    assert torch.equal(logits[1], BASE)


def test_repetition_penalty_covers_prompt_and_output():
    logits = rows()
    apply_penalties(logits, [P(), P(repetition_penalty=2.0)], [[0], [3, 1, 1]], num_prompt=[1, 1])
    want = BASE.clone()
    want[3] = 3.0 / 2  # positive: divided
    want[1] = -1.0 * 2  # negative: multiplied
    assert torch.equal(logits[0], BASE) and torch.equal(logits[1], want)


def test_logit_bias_is_added_and_clipped():
    logits = rows()
    apply_masks(logits, [P(logit_bias={1: 4.0, 6: -500.0}), P()])
    want = BASE.clone()
    want[1] += 4.0
    want[6] += -100.0
    assert torch.equal(logits[0], want) and torch.equal(logits[1], BASE)


def test_allowed_token_ids_and_banned_tokens():
    logits = rows(3)
    apply_masks(logits, [P(allowed_token_ids=[1, 4]), P(), P()], banned=[[], [3, 0], []])
    inf = float("-inf")
    assert logits[0].tolist() == [inf, -1.0, inf, inf, -2.0, inf, inf, inf]
    want = BASE.clone()
    want[[3, 0]] = inf
    assert torch.equal(logits[1], want) and torch.equal(logits[2], BASE)


def test_bitmask_keeps_only_allowed_tokens():
    word = (1 << 2) | (1 << 6)  # tokens 2 and 6
    mask = torch.tensor([[word]], dtype=torch.int32)
    assert unpack_bitmask(mask, V)[0].nonzero().flatten().tolist() == [2, 6]
    logits = rows()
    apply_masks(logits, [P(), P()], bitmask=mask, bitmask_rows=[1])
    assert torch.equal(logits[0], BASE)
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [2, 6]
    with pytest.raises(ValueError, match=r"sample: bitmask must be int32 \[1, 1\]"):
        apply_masks(rows(), [P(), P()], bitmask=torch.zeros(2, 1, dtype=torch.int32), bitmask_rows=[1])


def test_bitmask_high_bit_word():
    """Bit 31 (the int32 sign bit) allows token 31: the unpacking must not lose it to sign extension."""
    mask = torch.tensor([[-(1 << 31)]], dtype=torch.int32)
    assert unpack_bitmask(mask, 32)[0].nonzero().flatten().tolist() == [31]


def test_min_p_drops_tokens_below_a_fraction_of_the_top():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.12, 0.08]]))
    gen = torch.Generator().manual_seed(0)
    seen = {sample(logits, [P(temperature=1.0, min_p=0.2)], [gen], [[0]]).token_ids[0] for _ in range(300)}
    assert seen == {0, 1, 2}  # 0.08 < 0.2 * 0.5 = 0.1 is dropped; 0.12 stays
    kept = apply_min_p(logits.repeat(2, 1), torch.tensor([0.2, 0.7]))
    assert torch.isfinite(kept).tolist() == [[True, True, True, False], [True, False, False, False]]


def test_logprobs_are_log_softmax_of_raw_logits_before_penalties():
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    raw = logits.clone()
    params = [P(logprobs=3, repetition_penalty=1.7, logit_bias={7: 50.0}), P(), P(logprobs=0)]
    out = sample(logits, params, [None] * 3, [[1, 2, 7], [4], [5]], num_prompt=[1, 1, 1])
    lp = torch.log_softmax(raw, -1)
    assert out.logprobs[1] is None
    for r in (0, 2):
        row = out.logprobs[r]
        tok = out.token_ids[r]
        assert row.token_id == tok
        assert math.isclose(row.logprob, lp[r, tok].item(), abs_tol=1e-6)
        assert row.rank == int((lp[r] > lp[r, tok]).sum()) + 1
    top = lp[0].topk(3)
    assert out.logprobs[0].top_ids == top.indices.tolist()
    torch.testing.assert_close(torch.tensor(out.logprobs[0].top_logprobs), top.values)
    assert out.logprobs[2].top_ids == []
    assert out.token_ids[0] == 7  # the bias decided the sampled token, the logprob is still the raw one


def test_plain_rows_sample_as_before():
    torch.manual_seed(1)
    logits = torch.randn(4, 30)
    out = sample(logits.clone(), [P()] * 4, [None] * 4, [[0]] * 4)
    assert out.token_ids == logits.argmax(-1).tolist() and out.logprobs == [None] * 4


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match=r"sample: logit_bias has token ids outside \[0, 8\)"):
        apply_masks(rows(1), [P(logit_bias={8: 1.0})])
    with pytest.raises(ValueError, match="sample: num_prompt needs one entry per logits row"):
        sample(rows(2), [P(), P()], [None, None], [[0], [0]], num_prompt=[1])
    with pytest.raises(ValueError, match="presence / frequency penalties need num_prompt"):
        apply_penalties(rows(1), [P(presence_penalty=1.0)], [[0]], None)


def test_greedy_is_torch_argmax_first_maximum_and_nan_included():
    """The CPU fast path (numpy) picks what torch.argmax picks: the first of tied maxima, a NaN as the
    maximum (the first NaN), index 0 for a row of -inf; bf16 logits (torch's own argmax) agree too."""
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(6, 49152, generator=gen)
    rows[1, [5, 900, 40000]] = 100.0  # ties: the first wins
    rows[2, [7, 30000]] = float("nan")
    rows[2, 3] = float("inf")
    rows[3] = float("-inf")
    rows[4, 49151] = 1e9  # the last column
    rows[5, [11, 12]] = float("inf")
    expected = rows.argmax(dim=-1).tolist()
    assert expected[1:] == [5, 7, 0, 49151, 11]  # torch's rule, as the test states it
    assert greedy(rows) == expected
    assert greedy(rows[::2]) == expected[::2]  # strided rows
    assert greedy(rows[:0]) == []
    half = rows.to(torch.bfloat16)
    assert greedy(half) == half.argmax(dim=-1).tolist()


def test_half_precision_logits_calls_do_not_leak_into_each_other():
    """sample() converts bf16 / fp16 CPU logits into a per-thread float32 buffer reused by the next call:
    each call sees its own logits (the previous call's in-place penalties gone), the caller's tensor is
    not modified, and logprobs come from the call's own raw logits."""
    gen = torch.Generator().manual_seed(1)
    for dtype in (torch.bfloat16, torch.float16):
        a = torch.randn(2, 300, generator=gen).to(dtype)
        b = torch.randn(2, 300, generator=gen).to(dtype)
        a_before = a.clone()
        penal = P(repetition_penalty=1e4, logprobs=0)  # pushes the seen token down, in place
        seen = [[int(a[0].float().argmax())], []]
        first = sample(a, [penal, P()], [None, None], seen)
        assert torch.equal(a, a_before)
        assert first.token_ids[0] != seen[0][0] and first.token_ids[1] == int(a[1].float().argmax())
        second = sample(b, [P(logprobs=0), P()], [None, None], [[], []])
        assert second.token_ids == b.float().argmax(dim=-1).tolist()
        assert second.logprobs[0] is not None
        expected = torch.log_softmax(b[0].float(), -1)[second.token_ids[0]].item()
        assert math.isclose(second.logprobs[0].logprob, expected, rel_tol=1e-6)


def test_tiny_temperatures_are_greedy_and_a_tiny_top_p_keeps_the_top_token():
    """Temperature 1e-40 (0 in float32) or 5e-324 would make the probabilities NaN; below SAMPLING_EPS a row
    is greedy. A top_p below float32's smallest value keeps the top token."""
    torch.manual_seed(0)
    logits = torch.randn(4, 50) * 4
    params = [P(temperature=5e-324), P(temperature=1e-40), P(temperature=1.0, top_p=1e-46), P(temperature=1e-6)]
    out = sample(logits.clone(), params, [None] * 4, [[0]] * 4)
    assert out.token_ids == logits.argmax(-1).tolist() and not out.errors


def _seeded(n: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(100 + b) for b in range(n)]


def test_a_row_that_cannot_be_sampled_fails_alone():
    """A row whose logits are NaN (sampled or greedy), whose masks raise, or whose every token is masked
    gets an error and token -1; every other row gets the token it gets when sampled without them."""
    torch.manual_seed(1)
    good = torch.randn(3, V) * 2
    good_params = [P(temperature=0.8, logprobs=2), P(repetition_penalty=1.5), P(temperature=1.2, top_k=3)]
    bad = torch.randn(4, V)
    bad[0, 3] = float("nan")
    bad[1, 5] = float("nan")
    bad_params = [P(temperature=1.0), P(), P(logit_bias={V: 1.0}), P(allowed_token_ids=[1], logprobs=1)]
    # interleave: good 0, bad 0, good 1, bad 1, good 2, bad 2, bad 3
    order = [("g", 0), ("b", 0), ("g", 1), ("b", 1), ("g", 2), ("b", 2), ("b", 3)]
    logits = torch.stack([good[i] if k == "g" else bad[i] for k, i in order])
    params = [good_params[i] if k == "g" else bad_params[i] for k, i in order]
    gens = {("g", i): g for i, g in enumerate(_seeded(3))}
    banned = [[1] if (k, i) == ("b", 3) else [] for k, i in order]  # with allowed [1]: nothing left
    tokens = [[0, 1]] * len(order)
    out = sample(logits, params, [gens.get(o) for o in order], tokens, banned=banned, logprob_rows=[0, 1])
    alone = sample(good.clone(), good_params, _seeded(3), [[0, 1]] * 3)
    got = [out.token_ids[r] for r, (k, _) in enumerate(order) if k == "g"]
    assert got == alone.token_ids
    assert [out.logprobs[r] for r, (k, _) in enumerate(order) if k == "g"][0] == alone.logprobs[0]
    assert sorted(out.errors) == [1, 3, 5, 6]
    assert all(out.token_ids[r] == -1 and out.logprobs[r] is None for r in out.errors)
    assert "outside [0, 8)" in out.errors[5] and "NaN" in out.errors[1]
    assert out.errors[6] == NOTHING_ALLOWED  # its own masks left nothing: the request's fault


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_row_its_masks_empty_is_the_requests_fault_a_row_of_nan_the_engines(temperature):
    """Masks that remove every token of finite logits: NOTHING_ALLOWED (a client error upstream); the same
    masks over NaN logits, or NaN alone: NOT_FINITE (the engine's)."""
    logits = torch.randn(3, V)
    logits[1, 2] = float("nan")
    logits[2] = float("nan")
    p = P(temperature=temperature, allowed_token_ids=[1, 2])
    out = sample(logits, [p, p, P(temperature=temperature)], [None] * 3, [[0]] * 3, banned=[[1, 2], [1], []])
    assert out.errors == {0: NOTHING_ALLOWED, 1: NOT_FINITE, 2: NOT_FINITE}


@pytest.mark.parametrize("vocab", [8, 1000, 4096])  # one cumulative sum; two levels (chunks of 128)
def test_draw_follows_the_distribution_and_never_picks_a_zero_weight(vocab):
    """`draw` (inverse transform sampling) against the exact probabilities: 20000 draws of one row whose
    weights are unnormalized and have zeros; every frequency within 5 standard deviations of its expectation
    (plus 4 draws: a token expected 0.01 times may come once or twice), the frequencies of every 64 tokens
    within 5 standard deviations, no zero-weight token ever drawn."""
    from keel.layers.sampler import draw

    gen = torch.Generator().manual_seed(5)
    w = torch.rand(vocab, generator=gen) ** 4 * 3.0  # skewed, sums to far from 1
    w[torch.randperm(vocab, generator=gen)[: vocab // 4]] = 0.0
    w[0] = w[-1] = 0.0  # the first and the last token (the edges of both levels)
    n = 20000
    rows = w.repeat(500, 1)
    counts = torch.zeros(vocab)
    g = torch.Generator().manual_seed(0)
    for _ in range(n // 500):
        for t in draw(rows.clone(), [g] * 500):
            counts[t] += 1
    assert counts[w == 0].sum() == 0
    p = w / w.sum()
    sd = (n * p * (1 - p)).sqrt()
    assert ((counts - n * p).abs() <= 5 * sd + 4).all()
    if vocab % 64 == 0:
        pb, cb = p.view(-1, 64).sum(-1), counts.view(-1, 64).sum(-1)
        assert ((cb - n * pb).abs() <= 5 * (n * pb * (1 - pb)).sqrt()).all()


def test_draw_rows_depend_on_their_own_weights_and_generator_only():
    """A seeded row draws the same token whatever the other rows are (the batch cannot change a seeded
    request's tokens), and the same seed draws the same tokens again."""
    from keel.layers.sampler import draw

    torch.manual_seed(3)
    w = torch.rand(6, 1024)
    alone = [draw(w[2:3].clone(), [torch.Generator().manual_seed(9)])[0] for _ in range(3)]
    batch = draw(w.clone(), [None, None, torch.Generator().manual_seed(9), None, None, None])
    assert alone == [alone[0]] * 3 and batch[2] == alone[0]


def test_draw_target_rounding_to_the_total_picks_the_last_positive_weight(monkeypatch):
    """A uniform that rounds u times the total up to the total (the end of the last chunk) still draws a
    token of positive weight: the last one."""
    import keel.layers.sampler as sampler

    w = torch.zeros(2, 1024)
    w[0, 700] = w[0, 5] = 1.0
    w[1, 3] = 2.0
    monkeypatch.setattr(sampler.torch, "rand", lambda n, **kw: torch.full((n,), 1.0, dtype=torch.float64))
    assert sampler.draw(w, [None, None]) == [700, 3]
    assert sampler.draw(w[:, :8].contiguous(), [None, None]) == [5, 3]  # one level (vocab under 4 chunks)


@pytest.mark.parametrize(
    ("top_k", "top_p", "min_p"),
    [
        (20, 1.0, 0.0),
        (0, 0.9, 0.0),
        (0, 0.999, 0.0),
        (40, 0.8, 0.0),
        (0, 0.9, 0.02),
        (30, 1.0, 0.05),
        (0, 1.0, 0.2),
        (0, 0.97, 0.2),
    ],
)
def test_filtered_draw_follows_min_p_top_k_top_p(monkeypatch, top_k, top_p, min_p):
    """`draw_filtered` (candidates from topk, growing past `TOP_P_CANDIDATES` when they hold less than top_p)
    hands `draw` (whose own draws are tested above) exactly the distribution that `apply_min_p` then
    `filter_top_k_top_p` then softmax define: the candidates' weights, read at each position `draw` may
    answer, put every token's probability within 1e-6 of the reference's, none outside it. Real draws then
    pick no token outside it."""
    import keel.layers.sampler as sampler

    monkeypatch.setattr(sampler, "TOP_P_CANDIDATES", 16)  # (0, 0.999): 16 -> 64 -> 256 -> the whole row
    gen = torch.Generator().manual_seed(11)
    row = torch.randn(600, generator=gen) * 2
    ref = sampler.apply_min_p(row[None].clone(), torch.tensor([min_p]))[0] if min_p else row.clone()
    p = sampler.filter_top_k_top_p(ref, top_k, top_p).softmax(-1)

    real_draw, seen, position = sampler.draw, [], [0]

    def fake(weights, generators):  # `draw` answering `position` of the candidates it was handed
        seen.append(weights[0].clone())
        return [position[0]]

    monkeypatch.setattr(sampler, "draw", fake)
    q = torch.zeros(600, dtype=torch.float64)
    while not seen or position[0] < len(seen[0]):
        token = sampler.draw_filtered(row, top_k, top_p, min_p, None)
        q[token] += float(seen[0][position[0]]) / float(seen[0].sum())
        position[0] += 1
    assert all(torch.equal(w, seen[0]) for w in seen)
    assert torch.equal(q > 0, p > 0) and torch.allclose(q, p.double(), rtol=0, atol=1e-6), (q - p).abs().max()

    monkeypatch.setattr(sampler, "draw", real_draw)
    g = torch.Generator().manual_seed(1)
    drawn = torch.tensor([sampler.draw_filtered(row, top_k, top_p, min_p, g) for _ in range(500)])
    assert bool((p[drawn] > 0).all())


def test_sample_with_top_p_tiny_keeps_the_top_token_and_seeded_rows_ignore_the_batch():
    """Through `sample`: top_p below float32's smallest value draws the top token; a seeded top-p / top-k row
    draws the same token alone and among other rows."""
    torch.manual_seed(2)
    logits = torch.randn(3, 500) * 3
    params = [P(temperature=1.0, top_p=1e-46), P(temperature=0.7, top_p=0.9, top_k=50), P(temperature=1.0)]
    seeded = [None, torch.Generator().manual_seed(4), None]
    out = sample(logits.clone(), params, seeded, [[0]] * 3)
    alone = sample(logits[1:2].clone(), params[1:2], [torch.Generator().manual_seed(4)], [[0]])
    assert out.token_ids[0] == int(logits[0].argmax()) and out.token_ids[1] == alone.token_ids[0] and not out.errors
