"""What the engine reports: `RequestOutput` per request and step (with `Logprob`s and, from `LLM.generate`,
its `CompletionOutput`s), `EngineMetrics`, `GenerateStats`."""

from __future__ import annotations

import time
from dataclasses import dataclass

from keel.engine.sequence import Sequence


@dataclass(slots=True, frozen=True)
class Logprob:
    """One token's log-probability: log_softmax of the model's raw logits (before temperature, penalties
    and masks), float32; `rank` 1 is the most likely token; `decoded_token` is that token alone, decoded."""

    logprob: float
    rank: int
    decoded_token: str


TokenLogprobs = dict[int, Logprob]  # the sampled (or prompt) token plus the top k, by token id


@dataclass(slots=True, frozen=True)
class CompletionOutput:
    """One of a prompt's n completions (`LLM.generate` with n > 1 or best_of; vLLM's shape)."""

    index: int  # 0 .. n-1, best first when best_of ranked them
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None  # sum of the sampled tokens' logprobs (None: not computed)
    logprobs: list[TokenLogprobs] | None
    finish_reason: str | None


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
    finish_reason: str | None  # "stop" (eos or stop string), "length", "abort", "error"; None while running
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    ttft_s: float  # time to first token, from add_request
    total_s: float  # from add_request to this output
    logprobs: list[TokenLogprobs] | None = None  # SamplingParams.logprobs: one dict per output token so far
    new_logprobs: list[TokenLogprobs] | None = None  # parallel to new_token_ids: this step's
    prompt_logprobs: list[TokenLogprobs | None] | None = None  # complete from the first output; [0] is None
    cumulative_logprob: float | None = None  # sum of the sampled tokens' logprobs (when logprobs are computed)
    outputs: list[CompletionOutput] | None = None  # LLM.generate: the n completions (this one is outputs[0])
    error: str | None = None  # finish_reason "error": what failed for this request alone (the others go on)
    error_param: str | None = None  # set when the failure is the request's own (a 4xx): the field at fault


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
    logprobs = seq.logprobs
    if logprobs is not None:
        logprobs = list(logprobs)  # a snapshot: the sequence's list grows after this step
    new_logprobs = logprobs[len(logprobs) - len(new_token_ids) :] if logprobs is not None else None
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
        logprobs=logprobs,
        new_logprobs=new_logprobs,
        prompt_logprobs=seq.prompt_logprobs,
        cumulative_logprob=seq.cumulative_logprob if seq.tracks_logprob else None,
        error=seq.error,
        error_param=seq.error_param,
    )
