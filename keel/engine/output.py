"""What the engine reports: `RequestOutput` per request and step, `EngineMetrics`, `GenerateStats`."""

from __future__ import annotations

import time
from dataclasses import dataclass

from keel.engine.sequence import Sequence


@dataclass(slots=True, frozen=True)
class RequestOutput:
    """A request's state after a step: everything so far plus what this step added."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str  # all text released so far (a possible stop string's prefix is held back until decided)
    token_ids: list[int]  # all output tokens so far
    delta_text: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None  # "stop" (eos or stop string), "length", "abort"; None while running
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    ttft_s: float  # time to first token, from add_request
    total_s: float  # from add_request to this output


@dataclass(slots=True, frozen=True)
class EngineMetrics:
    """Counters for monitoring; `kv_blocks_total` is the capacity max_kv_cache_bytes allows."""

    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    prompt_tokens_total: int
    generation_tokens_total: int
    num_preemptions: int
    prefix_cache_queries: int  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int  # of those, tokens served from it


@dataclass(slots=True)
class GenerateStats:
    """Time and tokens by phase: steps with any prompt work count as prefill, the others as decode."""

    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0


def request_output(seq: Sequence, new_token_ids: list[int], delta: str) -> RequestOutput:
    """The output of `seq` after a step that added `new_token_ids` and released `delta`."""
    end = seq.end_s if seq.finish is not None else time.perf_counter()
    return RequestOutput(
        request_id=seq.request_id,
        prompt=seq.prompt,
        prompt_token_ids=seq.prompt_token_ids,
        text=seq.text[: seq.streamed],
        token_ids=seq.output_ids,
        delta_text=delta,
        new_token_ids=new_token_ids,
        finished=seq.finish is not None,
        finish_reason=seq.finish.value if seq.finish is not None else None,
        num_cached_tokens=max(seq.num_cached_tokens, 0),
        ttft_s=(seq.first_token_s - seq.start_s) if seq.first_token_s else 0.0,
        total_s=end - seq.start_s,
    )
