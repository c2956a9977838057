"""Turn last-position logits [B, V] into next tokens: repetition penalty, then greedy or temperature /
top-k / top-p sampling, row by row with each request's own parameters and generator.

The seam takes plain per-row inputs (parameters, generator, tokens seen so far), nothing of the engine's
request state, so a batched sampler can replace it behind the same call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch


class SamplingOptions(Protocol):
    """What the sampler reads of one request's parameters (`keel.SamplingParams` has these fields)."""

    @property
    def temperature(self) -> float: ...  # 0: greedy

    @property
    def top_k(self) -> int: ...  # 0: off

    @property
    def top_p(self) -> float: ...  # 1.0: off

    @property
    def repetition_penalty(self) -> float: ...  # 1.0: off


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
        logits = logits.masked_fill(drop.scatter(0, order, drop), float("-inf"))
    return logits


@torch.inference_mode()
def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingOptions],
    generators: Sequence[torch.Generator | None],
    token_ids: Sequence[Sequence[int]],
) -> list[int]:
    """Next token per row of logits [B, V] (any float dtype). Row b samples with `params[b]` and
    `generators[b]` (None: torch's global RNG); `token_ids[b]` (prompt + output) feeds the repetition penalty."""
    if not len(params) == len(generators) == len(token_ids) == logits.shape[0]:
        raise ValueError(
            f"sample: expected one params / generator / token_ids entry per logits row ({logits.shape[0]}), "
            f"got {len(params)} / {len(generators)} / {len(token_ids)}"
        )
    logits = logits.float()
    for row, p in enumerate(params):
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(token_ids[row])), dtype=torch.long, device=logits.device)
            apply_repetition_penalty(logits[row], seen, p.repetition_penalty)
    out = logits.argmax(dim=-1).tolist()  # greedy rows; sampled rows are overwritten below
    for row, p in enumerate(params):
        if p.temperature == 0.0:
            continue
        row_logits = filter_top_k_top_p(logits[row] / p.temperature, p.top_k, p.top_p)
        probs = row_logits.softmax(-1)
        out[row] = int(torch.multinomial(probs, 1, generator=generators[row]).item())
    return out
