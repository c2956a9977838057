"""Logprobs in OpenAI's response shapes, from the engine's per-token `{token id: Logprob}` dicts.

Chat: `choices[].logprobs.content[]` = {token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}.
Completions: `choices[].logprobs` = {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset},
where an echoed prompt's first token has a null logprob and null top logprobs (nothing predicts it).
vLLM's `prompt_logprobs` keep its shape: per prompt token null or {"id": {logprob, rank, decoded_token}}.
`-inf` becomes -9999.0, the finite number OpenAI uses, so the JSON stays valid.
"""

from __future__ import annotations

import math
from typing import Any

FLOOR = -9999.0


def clamp(value: float) -> float:
    return FLOOR if math.isnan(value) or value < FLOOR else float(value)


def token_text(tokenizer: Any, token_id: int, entry: Any, as_ids: bool) -> str:
    """The token as a client sees it: vLLM's `token_id:N` when asked, else its decoded text."""
    if as_ids:
        return f"token_id:{token_id}"
    if entry is not None and getattr(entry, "decoded_token", None) is not None:
        return str(entry.decoded_token)
    return str(tokenizer.decode([token_id], skip_special_tokens=False))


def _top(step: dict[int, Any], k: int) -> list[tuple[int, Any]]:
    """The k most likely entries of one step (rank 1 first)."""
    return sorted(((t, e) for t, e in step.items() if e.rank <= k), key=lambda te: te[1].rank)[:k]


def chat_content(
    token_ids: list[int], steps: list[dict[int, Any]], top: int, tokenizer: Any, as_ids: bool = False
) -> list[dict[str, Any]]:
    """`logprobs.content` entries of chat completions, one per output token."""
    content = []
    for tid, step in zip(token_ids, steps, strict=False):
        entry = step.get(tid)
        token = token_text(tokenizer, tid, entry, as_ids)
        tops = []
        for t, e in _top(step, top):
            s = token_text(tokenizer, t, e, as_ids)
            tops.append({"token": s, "logprob": clamp(e.logprob), "bytes": list(s.encode("utf-8", "replace"))})
        content.append(
            {
                "token": token,
                "logprob": clamp(entry.logprob) if entry is not None else FLOOR,
                "bytes": list(token.encode("utf-8", "replace")),
                "top_logprobs": tops,
            }
        )
    return content


def completion_logprobs(
    token_ids: list[int],
    steps: list[dict[int, Any] | None],
    top: int,
    tokenizer: Any,
    offset: int,
    as_ids: bool = False,
) -> tuple[dict[str, Any], int]:
    """Completions' `logprobs` object for these tokens, text offsets from `offset`; also the next offset."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []
    for tid, step in zip(token_ids, steps, strict=False):
        entry = step.get(tid) if step is not None else None
        token = token_text(tokenizer, tid, entry, as_ids)
        tokens.append(token)
        text_offset.append(offset)
        offset += len(token)
        if step is None:
            token_logprobs.append(None)
            top_logprobs.append(None)
            continue
        token_logprobs.append(clamp(entry.logprob) if entry is not None else FLOOR)
        tops: dict[str, float] = {}
        if entry is not None:  # the sampled token, then the top k (OpenAI: up to k + 1 entries)
            tops[token] = clamp(entry.logprob)
        for t, e in _top(step, top):
            tops.setdefault(token_text(tokenizer, t, e, as_ids), clamp(e.logprob))
        top_logprobs.append(tops)
    body = {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    }
    return body, offset


def vllm_prompt_logprobs(steps: list[dict[int, Any] | None] | None) -> list[dict[str, dict[str, Any]] | None] | None:
    """vLLM's `prompt_logprobs`: per prompt token null (the first) or {id: {logprob, rank, decoded_token}}."""
    if steps is None:
        return None
    return [
        None
        if step is None
        else {
            str(t): {"logprob": clamp(e.logprob), "rank": e.rank, "decoded_token": e.decoded_token}
            for t, e in step.items()
        }
        for step in steps
    ]


def cumulative(token_ids: list[int], steps: list[dict[int, Any]]) -> float:
    """Sum of the sampled tokens' logprobs (what best_of ranks candidates by)."""
    total = 0.0
    for tid, step in zip(token_ids, steps, strict=False):
        entry = step.get(tid)
        total += entry.logprob if entry is not None else FLOOR
    return total
