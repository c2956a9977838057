"""Turn last-position logits [B, V] into next tokens, batched over the rows that ask for each step:

1. logprobs (log_softmax of the RAW logits, float32) for the rows that want them, before anything else;
2. logits processors as tensor ops over the rows that use them: repetition penalty (prompt + output),
   presence / frequency penalties (OpenAI: output tokens), logit bias, allowed token ids, banned tokens
   (min_tokens' eos / stop ids, bad words, chosen by the caller) and a grammar's token bitmask;
3. greedy argmax, or temperature -> min_p -> top-k / top-p -> one draw per row with its generator (`draw`).

A batch whose rows use none of these pays a few attribute reads per row. The seam takes plain per-row
inputs (parameters, generator, tokens seen so far), nothing of the engine's request state."""

from __future__ import annotations

import itertools
import math
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

# Temperatures below this sample greedily (vLLM's _SAMPLING_EPS): dividing logits by a tinier one
# overflows float32 (1e-40 is a denormal; 5e-324 is 0) and the probabilities become inf / NaN.
SAMPLING_EPS = 1e-5


class SamplingOptions(Protocol):
    """What the sampler reads of one request's parameters (`keel.SamplingParams` has these fields)."""

    @property
    def temperature(self) -> float: ...  # 0 (below SAMPLING_EPS): greedy

    @property
    def top_k(self) -> int: ...  # 0: off

    @property
    def top_p(self) -> float: ...  # 1.0: off

    @property
    def min_p(self) -> float: ...  # 0: off

    @property
    def repetition_penalty(self) -> float: ...  # 1.0: off

    @property
    def presence_penalty(self) -> float: ...  # 0: off

    @property
    def frequency_penalty(self) -> float: ...  # 0: off

    @property
    def logit_bias(self) -> dict[int, float] | None: ...

    @property
    def allowed_token_ids(self) -> list[int] | None: ...

    @property
    def logprobs(self) -> int | None: ...  # None: off; k: sampled token + top k


@dataclass(slots=True, frozen=True)
class RowLogprobs:
    """The sampled token's raw logprob and rank (1 = most likely) and the top-k tokens' ids and logprobs."""

    token_id: int
    logprob: float
    rank: int
    top_ids: list[int]
    top_logprobs: list[float]


@dataclass(slots=True)
class SamplerOutput:
    token_ids: list[int]  # one per row (-1 for a row in `errors`)
    logprobs: list[RowLogprobs | None]  # one per row; None where nobody asked (or the row failed)
    errors: dict[int, str] = field(default_factory=dict)  # row -> why it has no token; the other rows are fine


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> None:
    """In place on one row [V]: seen tokens' logits divided (if > 0) or multiplied (if < 0) by `penalty`."""
    scores = logits[seen]
    logits[seen] = torch.where(scores < 0, scores * penalty, scores / penalty)


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask one row [V] to its top-k tokens, then to the smallest set with probability mass >= top_p."""
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= top_p  # mass before this token already reaches top_p
        drop[0] = False  # the top token always stays (a top_p below float32's smallest value is 0 there)
        logits = logits.masked_fill(drop.scatter(0, order, drop), float("-inf"))
    return logits


def _scatter_index(lists: Sequence[Sequence[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) index tensors of every element of `lists` (row r holds lists[r])."""
    lengths = torch.tensor([len(x) for x in lists], dtype=torch.long)
    rows = torch.repeat_interleave(torch.arange(len(lists)), lengths).to(device)
    cols = torch.tensor(list(itertools.chain.from_iterable(lists)), dtype=torch.long, device=device)
    return rows, cols


def _check_ids(op: str, cols: torch.Tensor, vocab: int) -> None:
    if cols.numel() and (int(cols.min()) < 0 or int(cols.max()) >= vocab):
        raise ValueError(f"sample: {op} has token ids outside [0, {vocab}) (the logits' width)")


def apply_penalties(
    logits: torch.Tensor,
    params: Sequence[SamplingOptions],
    token_ids: Sequence[Sequence[int]],
    num_prompt: Sequence[int] | None,
) -> None:
    """In place on logits [B, V]: repetition penalty over prompt + output tokens (vLLM / transformers), then
    `presence_penalty * (count > 0) + frequency_penalty * count` subtracted over output tokens (OpenAI)."""
    vocab, dev = logits.shape[-1], logits.device
    rep = [b for b, p in enumerate(params) if p.repetition_penalty != 1.0]
    if rep:
        rows, cols = _scatter_index([token_ids[b] for b in rep], dev)
        _check_ids("token_ids", cols, vocab)
        seen = torch.zeros(len(rep), vocab, dtype=torch.bool, device=dev)
        seen[rows, cols] = True
        pen = torch.tensor([params[b].repetition_penalty for b in rep], device=dev)[:, None]
        idx = torch.tensor(rep, device=dev)
        sub = logits[idx]
        logits[idx] = torch.where(seen, torch.where(sub < 0, sub * pen, sub / pen), sub)
    freq = [b for b, p in enumerate(params) if p.presence_penalty or p.frequency_penalty]
    if freq:
        if num_prompt is None:
            raise ValueError("sample: presence / frequency penalties need num_prompt (where each row's output starts)")
        rows, cols = _scatter_index([token_ids[b][num_prompt[b] :] for b in freq], dev)
        _check_ids("token_ids", cols, vocab)
        counts = torch.zeros(len(freq), vocab, device=dev)
        counts.index_put_((rows, cols), torch.ones_like(cols, dtype=counts.dtype), accumulate=True)
        presence = torch.tensor([params[b].presence_penalty for b in freq], device=dev)[:, None]
        frequency = torch.tensor([params[b].frequency_penalty for b in freq], device=dev)[:, None]
        idx = torch.tensor(freq, device=dev)
        logits[idx] -= frequency * counts + presence * (counts > 0)


_BYTE_BITS = torch.tensor([[(b >> k) & 1 for k in range(8)] for b in range(256)], dtype=torch.bool)  # [256, 8]


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[R, ceil(V/32)] int32 (bit j of word w allows token 32w + j) -> [R, V] bool allowed: the words'
    little-endian bytes index a 256-row table of their 8 bits."""
    as_bytes = bitmask.contiguous().view(torch.uint8).long()  # [R, 4W], byte 4w + i holds tokens 32w + 8i ..
    if sys.byteorder == "big":  # the table is indexed by little-endian bytes
        as_bytes = as_bytes.view(bitmask.shape[0], -1, 4).flip(-1).reshape(bitmask.shape[0], -1)
    bits = _BYTE_BITS.to(bitmask.device)[as_bytes]  # [R, 4W, 8]
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab]


def apply_masks(
    logits: torch.Tensor,
    params: Sequence[SamplingOptions],
    banned: Sequence[Sequence[int]] | None = None,
    bitmask: torch.Tensor | None = None,
    bitmask_rows: Sequence[int] | None = None,
) -> None:
    """In place on logits [B, V]: add each row's logit_bias (clipped to [-100, 100]), keep only its
    allowed_token_ids, set `banned[b]` to -inf, and keep only the tokens `bitmask` allows in `bitmask_rows`."""
    vocab, dev = logits.shape[-1], logits.device
    biased = [b for b, p in enumerate(params) if p.logit_bias]
    if biased:
        items = [list(params[b].logit_bias.items()) for b in biased]  # type: ignore[union-attr]
        rows, cols = _scatter_index([[t for t, _ in it] for it in items], dev)
        _check_ids("logit_bias", cols, vocab)
        vals = torch.tensor([v for it in items for _, v in it], device=dev).clamp(-100.0, 100.0)
        logits.index_put_((torch.tensor(biased, device=dev)[rows], cols), vals, accumulate=True)
    allow = [b for b, p in enumerate(params) if p.allowed_token_ids is not None]
    if allow:
        rows, cols = _scatter_index([params[b].allowed_token_ids or [] for b in allow], dev)
        _check_ids("allowed_token_ids", cols, vocab)
        keep = torch.zeros(len(allow), vocab, dtype=torch.bool, device=dev)
        keep[rows, cols] = True
        idx = torch.tensor(allow, device=dev)
        logits[idx] = logits[idx].masked_fill(~keep, float("-inf"))
    if banned is not None and any(banned):
        rows, cols = _scatter_index(banned, dev)
        _check_ids("banned", cols, vocab)
        logits[rows, cols] = float("-inf")
    if bitmask is not None and bitmask_rows:
        if bitmask.shape != (len(bitmask_rows), (vocab + 31) // 32) or bitmask.dtype != torch.int32:
            raise ValueError(
                f"sample: bitmask must be int32 [{len(bitmask_rows)}, {(vocab + 31) // 32}] (one row per "
                f"bitmask_rows entry, 32 tokens a word), got {tuple(bitmask.shape)} {bitmask.dtype}"
            )
        idx = torch.tensor(list(bitmask_rows), device=dev)
        ok = unpack_bitmask(bitmask.to(dev), vocab)
        logits[idx] = logits[idx].masked_fill(~ok, float("-inf"))


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Rows [R, V] (already divided by temperature): drop tokens whose probability is below min_p [R] times
    the row's top probability."""
    probs = logits.softmax(-1)
    floor = probs.amax(-1, keepdim=True) * min_p[:, None]
    return logits.masked_fill(probs < floor, float("-inf"))


def _logprobs(raw: torch.Tensor, tokens: list[int], ks: list[int]) -> list[RowLogprobs]:
    """Raw logits rows [R, V] -> each row's sampled-token logprob, rank and top-k."""
    lp = torch.log_softmax(raw.float(), dim=-1)
    tok = torch.tensor(tokens, device=lp.device)[:, None]
    chosen = lp.gather(1, tok)  # [R, 1]
    ranks = ((lp > chosen).sum(-1) + 1).tolist()
    top_v, top_i = lp.topk(max(ks), dim=-1) if max(ks) else (lp[:, :0], lp[:, :0].long())
    chosen_l, top_vl, top_il = chosen[:, 0].tolist(), top_v.tolist(), top_i.tolist()
    return [
        RowLogprobs(tokens[r], chosen_l[r], ranks[r], top_il[r][: ks[r]], top_vl[r][: ks[r]])
        for r in range(len(tokens))
    ]


def prompt_logprobs(logits: torch.Tensor, next_ids: Sequence[int], k: int) -> list[RowLogprobs]:
    """Logits [N, V] of N prompt positions -> the logprob, rank and top-k of the token each predicts,
    `next_ids` (for a whole prompt: the logits of positions 0 .. L-2 and ids[1:]; a chunk gives its part)."""
    out: list[RowLogprobs] = []
    ids = list(next_ids)
    if len(ids) != logits.shape[0]:
        raise ValueError(f"prompt_logprobs: expected one next token per logits row ({logits.shape[0]}), got {len(ids)}")
    for start in range(0, len(ids), 512):  # bounded float32 copies for long prompts
        out += _logprobs(logits[start : start + 512], ids[start : start + 512], [k] * len(ids[start : start + 512]))
    return out


_scratch = threading.local()


def _as_float32(logits: torch.Tensor) -> torch.Tensor:
    """The logits in float32 for the steps below, which change them in place. A half-precision CPU input
    is converted into this thread's buffer of its shape, reused from call to call: a fresh [B, V] float32
    tensor each step is fresh memory from the OS each step (page faults that cost more than the conversion:
    docs/measurements/2026-12-02-decode-overhead.md). The buffer lives only within a call: nothing `sample` returns
    refers to it."""
    if logits.dtype == torch.float32 or logits.device.type != "cpu":
        return logits.float()
    buf = getattr(_scratch, "logits", None)
    if buf is None or buf.shape != logits.shape:
        buf = _scratch.logits = torch.empty(logits.shape, dtype=torch.float32)
    return buf.copy_(logits)


def _buffer(name: str, like: torch.Tensor) -> torch.Tensor:
    """This thread's scratch tensor `name` of `like`'s shape, dtype and device, reused from call to call on
    the CPU (fresh memory each step costs page faults, see `_as_float32`); a new tensor elsewhere. Its
    contents are the caller's to overwrite, and live only within one `sample` call."""
    if like.device.type != "cpu":
        return torch.empty_like(like)
    buf = getattr(_scratch, name, None)
    if buf is None or buf.shape != like.shape or buf.dtype != like.dtype:
        buf = torch.empty(like.shape, dtype=like.dtype)
        setattr(_scratch, name, buf)
    return buf


def greedy(logits: torch.Tensor) -> list[int]:
    """Each row's argmax of float32 logits [B, V]: the first index of the largest value, a NaN counting as
    the largest (torch.argmax's rule). On the CPU through numpy, whose vectorized argmax follows the same
    rule and is faster than torch's over a vocabulary-wide row (docs/measurements/2026-12-02-decode-overhead.md);
    elsewhere torch.argmax."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return logits.detach().numpy().argmax(axis=-1).tolist()
    return logits.argmax(dim=-1).tolist()


def _processed_rows(
    logits: torch.Tensor,
    rows: list[int],
    params: Sequence[SamplingOptions],
    token_ids: Sequence[Sequence[int]],
    num_prompt: Sequence[int] | None,
    banned: Sequence[Sequence[int]] | None,
    bitmask: torch.Tensor | None,
    bitmask_rows: Sequence[int] | None,
) -> None:
    """Penalties and masks for `rows` of logits [B, V], computed on a copy of those rows and written back
    only when all succeeded (a failure leaves `logits` as it was)."""
    idx = torch.tensor(rows, device=logits.device)
    work = logits[idx]  # a copy
    sub = [params[b] for b in rows]
    if any(p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty for p in sub):
        apply_penalties(
            work, sub, [token_ids[b] for b in rows], None if num_prompt is None else [num_prompt[b] for b in rows]
        )
    where = {b: i for i, b in enumerate(bitmask_rows or ())}
    masked = [(j, where[b]) for j, b in enumerate(rows) if b in where]
    sub_bitmask = bitmask[[i for _, i in masked]] if bitmask is not None and masked else None
    apply_masks(
        work,
        sub,
        None if banned is None else [banned[b] for b in rows],
        sub_bitmask,
        [j for j, _ in masked] if sub_bitmask is not None else None,
    )
    logits[idx] = work


def draw(weights: torch.Tensor, generators: Sequence[torch.Generator | None]) -> list[int]:
    """One token per row of weights [R, V] (non-negative, each row's sum positive: probabilities up to a
    factor), by inverse transform sampling: one uniform u per row (from the row's generator, or torch's
    global RNG for None) and the first token whose cumulative weight exceeds u times the row's total. An
    exact draw from each row's distribution that never picks a token of weight 0, each row's result from
    its own weights and generator only. One uniform per row, where `torch.multinomial` on the CPU draws
    one exponential per vocabulary entry."""
    dev = weights.device
    u = torch.empty(len(generators), dtype=torch.float64, device=dev)
    free = [r for r, g in enumerate(generators) if g is None]
    if free:
        u[torch.tensor(free, device=dev)] = torch.rand(len(free), dtype=torch.float64, device=dev)
    for r, g in enumerate(generators):
        if g is not None:
            u[r] = torch.rand(1, generator=g, dtype=torch.float64, device=dev)[0]
    total, vocab = len(generators), weights.shape[-1]
    chunk = _DRAW_CHUNK
    if vocab % chunk or vocab < 4 * chunk:  # a single cumulative sum over the row
        cdf = torch.cumsum(weights, -1, out=_buffer("cdf", weights))  # (CPU: float32 sums accumulate in float64)
        target = (u * cdf[:, -1].to(torch.float64)).to(cdf.dtype)
        picked = torch.searchsorted(cdf, target[:, None], right=True)[:, 0].tolist()
        return [t if t < vocab else _last_drawable(weights[r], vocab) for r, t in enumerate(picked)]
    # two levels (a sequential cumulative sum over the whole row costs more than the rest of the draw): the
    # chunk whose running total passes u times the row's total, then the token within that chunk
    sums = weights.view(total, -1, chunk).sum(-1).to(torch.float64)  # [R, chunks]
    cum = sums.cumsum(-1)
    target = u * cum[:, -1]
    which = torch.searchsorted(cum, target[:, None], right=True)[:, 0].clamp_(max=cum.shape[-1] - 1)
    before = torch.where(which > 0, cum.gather(1, (which - 1).clamp(min=0)[:, None])[:, 0], 0.0)
    cols = which[:, None] * chunk + torch.arange(chunk, device=dev)
    within = weights.gather(1, cols).to(torch.float64).cumsum(-1)
    at = torch.searchsorted(within, (target - before)[:, None], right=True)[:, 0]
    out = []
    for r, (c, i) in enumerate(zip(which.tolist(), at.tolist(), strict=True)):
        # i == chunk: rounding put the target past the chunk's own running sum (its last weight is the one)
        out.append(c * chunk + i if i < chunk else _last_drawable(weights[r], (c + 1) * chunk))
    return out


_DRAW_CHUNK = 128  # tokens per chunk of `draw`'s first level


def _last_drawable(row: torch.Tensor, end: int) -> int:
    """The last token before `end` of positive weight in one row of `draw`'s weights."""
    return int(torch.nonzero(row[:end]).max())


def draw_filtered(row: torch.Tensor, top_k: int, top_p: float, min_p: float, generator: torch.Generator | None) -> int:
    """One token of one row of temperature-scaled logits [V] under min_p, then top-k, then top-p (the
    order and rules of `apply_min_p` and `filter_top_k_top_p`), drawn among the candidates only: the top k
    tokens (`torch.topk`), or for top-p alone the top `TOP_P_CANDIDATES` when they hold top_p of the
    probability mass (else four times as many, up to a sort of the whole row), so no vocabulary-wide sort,
    scatter or mask runs for the common settings. The row's largest logit must be finite (`sample` checks)."""
    vocab = row.shape[-1]
    k = top_k if 0 < top_k < vocab else vocab
    if top_p < 1.0 and k == vocab:
        k = min(vocab, TOP_P_CANDIDATES)
    while True:
        vals, idx = torch.topk(row, k) if k < vocab else torch.sort(row, descending=True)
        weights = torch.exp(vals - vals[0])  # probability / the top token's
        if min_p:
            weights = weights.masked_fill(weights < min_p, 0.0)
        if top_p >= 1.0:
            break
        if 0 < top_k < vocab:  # top-p over the top-k tokens' renormalized probabilities
            total = weights.sum()
        else:  # over the whole vocabulary (after min_p)
            every = torch.exp(row - vals[0])
            total = (every.masked_fill(every < min_p, 0.0) if min_p else every).sum()
        cum = weights.cumsum(0) / total
        if k < vocab and not 0 < top_k < vocab and cum[-1] < top_p:
            k = min(vocab, 4 * k)  # the candidates hold less than top_p: four times as many (at last, all)
            continue
        before = cum - weights / total  # the mass before each candidate
        n = max(1, int((before < top_p).sum()))  # the top token always stays
        vals, idx, weights = vals[:n], idx[:n], weights[:n]
        break
    return int(idx[draw(weights[None], [generator])[0]])


TOP_P_CANDIDATES = 1024  # top-p without top-k: the candidates tried before a full sort of the row


def _failure(exc: BaseException) -> str:
    return f"sampling failed for this request: {type(exc).__name__}: {exc}"


NOT_FINITE = (
    "sampling failed for this request: its logits became NaN, +inf or all -inf (nothing left to sample) "
    "after its penalties, masks and temperature"
)
# a row whose own masks (allowed_token_ids, banned tokens, a grammar's bitmask) removed every token of finite
# logits: the request's fields leave nothing to sample, which is the request's fault, not the engine's
NOTHING_ALLOWED = "nothing can be sampled for this request: its masks allow no token at this step"


@torch.inference_mode()
def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingOptions],
    generators: Sequence[torch.Generator | None],
    token_ids: Sequence[Sequence[int]],
    *,
    num_prompt: Sequence[int] | None = None,
    banned: Sequence[Sequence[int]] | None = None,
    bitmask: torch.Tensor | None = None,
    bitmask_rows: Sequence[int] | None = None,
    logprob_rows: Sequence[int] | None = None,
) -> SamplerOutput:
    """Next token per row of logits [B, V] (any float dtype). Row b samples with `params[b]` and
    `generators[b]` (None: torch's global RNG); `token_ids[b]` (prompt + output, the output from
    `num_prompt[b]` on) feeds the penalties; `banned[b]` are masked this step; `bitmask` [R, ceil(V/32)]
    int32 restricts rows `bitmask_rows`. Logprobs come for rows whose params ask (`logprobs` not None) and
    for `logprob_rows` (sampled token only, unless the params ask for a top k).

    Stages: raw logprob rows kept, then penalties and masks, then greedy rows, then drawn rows, then the
    logprobs. A row that cannot be sampled (its penalties or masks raise, its logits are NaN / +inf / all
    -inf, or the draw raises) gets token -1 and an entry in `errors` (NOTHING_ALLOWED where its own masks
    removed every finite logit); the other rows are sampled as if it were not there. Malformed arguments
    (lengths, bitmask shape) still raise."""
    _check_arguments(logits, params, generators, token_ids, num_prompt, banned, bitmask, bitmask_rows)
    logits = _as_float32(logits)
    errors: dict[int, str] = {}
    lp_rows = sorted({b for b, p in enumerate(params) if p.logprobs is not None} | set(logprob_rows or ()))
    raw = logits[torch.tensor(lp_rows, device=logits.device)] if lp_rows else None  # a copy, before any change
    masked = _process(logits, params, token_ids, num_prompt, banned, bitmask, bitmask_rows, errors)
    out = [-1] * len(params)
    _sample_greedy(logits, params, masked, out, errors)
    _sample_drawn(logits, params, generators, masked, out, errors)
    for b in errors:
        out[b] = -1
    return SamplerOutput(out, _row_logprobs(raw, lp_rows, params, out, errors), errors)


def _check_arguments(
    logits: torch.Tensor,
    params: Sequence[SamplingOptions],
    generators: Sequence[torch.Generator | None],
    token_ids: Sequence[Sequence[int]],
    num_prompt: Sequence[int] | None,
    banned: Sequence[Sequence[int]] | None,
    bitmask: torch.Tensor | None,
    bitmask_rows: Sequence[int] | None,
) -> None:
    if not len(params) == len(generators) == len(token_ids) == logits.shape[0]:
        raise ValueError(
            f"sample: expected one params / generator / token_ids entry per logits row ({logits.shape[0]}), "
            f"got {len(params)} / {len(generators)} / {len(token_ids)}"
        )
    for name, per_row in (("num_prompt", num_prompt), ("banned", banned)):
        if per_row is not None and len(per_row) != len(params):
            raise ValueError(f"sample: {name} needs one entry per logits row ({len(params)}), got {len(per_row)}")
    vocab = logits.shape[-1]
    if (
        bitmask is not None
        and bitmask_rows
        and (bitmask.shape != (len(bitmask_rows), (vocab + 31) // 32) or bitmask.dtype != torch.int32)
    ):
        raise ValueError(
            f"sample: bitmask must be int32 [{len(bitmask_rows)}, {(vocab + 31) // 32}] (one row per "
            f"bitmask_rows entry, 32 tokens a word), got {tuple(bitmask.shape)} {bitmask.dtype}"
        )


def _process(
    logits: torch.Tensor,
    params: Sequence[SamplingOptions],
    token_ids: Sequence[Sequence[int]],
    num_prompt: Sequence[int] | None,
    banned: Sequence[Sequence[int]] | None,
    bitmask: torch.Tensor | None,
    bitmask_rows: Sequence[int] | None,
    errors: dict[int, str],
) -> set[int]:
    """Penalties and masks, in place, on the rows that use any (a row that raises is an error alone); returns
    the processed rows whose logits had a finite largest value before their masks."""
    masked = set(bitmask_rows or ()) | {b for b, ban in enumerate(banned or ()) if ban}
    proc = [
        b
        for b, p in enumerate(params)
        if p.repetition_penalty != 1.0
        or p.presence_penalty
        or p.frequency_penalty
        or p.logit_bias
        or p.allowed_token_ids is not None
        or b in masked
    ]
    if not proc:
        return set()
    before = torch.isfinite(logits[torch.tensor(proc, device=logits.device)].amax(-1)).tolist()
    args = (params, token_ids, num_prompt, banned, bitmask, bitmask_rows)
    try:
        _processed_rows(logits, proc, *args)
    except Exception as exc:  # noqa: BLE001 - find the rows that fail alone; the others go on
        for b in proc if len(proc) > 1 else ():
            try:
                _processed_rows(logits, [b], *args)
            except Exception as row_exc:  # noqa: BLE001
                errors[b] = _failure(row_exc)
        if len(proc) == 1:
            errors[proc[0]] = _failure(exc)
    return {b for b, ok in zip(proc, before, strict=True) if ok}


def _nothing_left(b: int, value: float, masked: set[int]) -> str:
    """Why row b has no token: its own masks emptied a row of finite logits, or its logits are not finite."""
    return NOTHING_ALLOWED if value == -math.inf and b in masked else NOT_FINITE


def _sample_greedy(
    logits: torch.Tensor, params: Sequence[SamplingOptions], masked: set[int], out: list[int], errors: dict[int, str]
) -> None:
    """Argmax of the greedy rows into `out`; a row whose argmax is NaN (any NaN in it) or -inf (every token
    masked) has no token to give."""
    cold = [b for b in range(len(params)) if b not in errors and params[b].temperature < SAMPLING_EPS]
    if not cold:
        return
    picked = greedy(logits)
    cols = [picked[b] for b in cold]
    if logits.device.type == "cpu":  # (numpy: no tensors built for a few values, as `greedy` does)
        chosen = logits.detach().numpy()[cold, cols].tolist()
    else:
        dev = logits.device
        chosen = logits[torch.tensor(cold, device=dev), torch.tensor(cols, device=dev)].tolist()
    for b, col, value in zip(cold, cols, chosen, strict=True):
        if math.isnan(value) or value == -math.inf:
            errors[b] = _nothing_left(b, value, masked)
        else:
            out[b] = col


def _sample_drawn(
    logits: torch.Tensor,
    params: Sequence[SamplingOptions],
    generators: Sequence[torch.Generator | None],
    masked: set[int],
    out: list[int],
    errors: dict[int, str],
) -> None:
    """The rows sampled at a temperature: scaled, then top-k / top-p / min_p drawn per row where set, one
    batched draw for the others."""
    hot = [b for b, p in enumerate(params) if p.temperature >= SAMPLING_EPS and b not in errors]
    if not hot:
        return
    dev, vocab = logits.device, logits.shape[-1]
    sub = logits if len(hot) == len(params) else logits[torch.tensor(hot, device=dev)]
    temps = [params[b].temperature for b in hot]
    scaled = sub / torch.tensor(temps, device=dev)[:, None] if any(t != 1.0 for t in temps) else sub
    top = scaled.amax(-1)
    tops = top.tolist()
    plain: list[int] = []  # rows of `scaled` drawn from the whole vocabulary
    for r, b in enumerate(hot):
        p = params[b]
        if not math.isfinite(tops[r]):  # NaN, +inf or all -inf: nothing to sample
            errors[b] = _nothing_left(b, tops[r], masked)
        elif 0 < p.top_k < vocab or p.top_p < 1.0:
            try:
                out[b] = draw_filtered(scaled[r], p.top_k, p.top_p, p.min_p, generators[b])
            except Exception as exc:  # noqa: BLE001 - this row alone fails
                errors[b] = _failure(exc)
        else:
            plain.append(r)
    if not plain:
        return
    keep = None if len(plain) == len(hot) else torch.tensor(plain, device=dev)
    rows, peak = (scaled, top) if keep is None else (scaled[keep], top[keep])
    weights = torch.sub(rows, peak[:, None], out=_buffer("weights", rows)).exp_()  # softmax's numerator
    min_p = [params[hot[r]].min_p for r in plain]
    if any(min_p):  # probability below min_p times the top one: weight below min_p (the top weighs 1)
        weights.masked_fill_(weights < torch.tensor(min_p, device=dev)[:, None], 0.0)
    for r, token in zip(plain, draw(weights, [generators[hot[r]] for r in plain]), strict=True):
        out[hot[r]] = token


def _row_logprobs(
    raw: torch.Tensor | None,
    lp_rows: list[int],
    params: Sequence[SamplingOptions],
    out: list[int],
    errors: dict[int, str],
) -> list[RowLogprobs | None]:
    """The logprobs of the raw logits for the rows that want them and got a token."""
    logprobs: list[RowLogprobs | None] = [None] * len(params)
    if raw is not None and errors:
        kept = [j for j, b in enumerate(lp_rows) if b not in errors]
        raw = raw[torch.tensor(kept, dtype=torch.long, device=raw.device)]
        lp_rows = [lp_rows[j] for j in kept]
    if raw is not None and lp_rows:
        ks = [params[b].logprobs or 0 for b in lp_rows]
        for b, row in zip(lp_rows, _logprobs(raw, [out[b] for b in lp_rows], ks), strict=True):
            logprobs[b] = row
    return logprobs
