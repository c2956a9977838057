"""Turn last-position logits into next tokens: penalty, greedy or temperature/top-k/top-p sampling."""

from __future__ import annotations

import torch

from keel.engine.sequence import Sequence


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
def sample(logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
    """Next token per sequence from logits [B, V] (any float dtype)."""
    logits = logits.float()
    for row, seq in enumerate(seqs):
        if seq.params.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(seq.token_ids)), dtype=torch.long, device=logits.device)
            apply_repetition_penalty(logits[row], seen, seq.params.repetition_penalty)
    out = logits.argmax(dim=-1).tolist()  # greedy rows; sampled rows are overwritten below
    for row, seq in enumerate(seqs):
        p = seq.params
        if p.greedy:
            continue
        row_logits = filter_top_k_top_p(logits[row] / p.temperature, p.top_k, p.top_p)
        probs = row_logits.softmax(-1)
        out[row] = int(torch.multinomial(probs, 1, generator=seq.generator).item())
    return out
