"""`Sequence`: one request's tokens, cache blocks, stop state and timing."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch

from keel.engine.sampling_params import SamplingParams
from keel.hf.tokenizer import IncrementalDetokenizer


class FinishReason(enum.Enum):
    """Why a request ended, spelled as OpenAI's `finish_reason`."""

    STOP = "stop"  # an eos token or a stop string
    LENGTH = "length"  # max_tokens or the model's context
    ABORT = "abort"  # abort_request
    ERROR = "error"  # this request alone failed (its sampler row or its forward pass): see Sequence.error


@dataclass(slots=True, eq=False)
class Sequence:
    """Mutable per-request state owned by the engine (the scheduler moves it between its queues); compared by
    identity (two requests with the same fields are still two)."""

    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    max_len: int  # prompt + max_tokens, capped to the model context
    detok: IncrementalDetokenizer | None = None
    generator: torch.Generator | None = None
    request_id: str = ""
    client: str | None = None  # who sent it (API key, else the connection's peer); None: anonymous
    token_ids: list[int] = field(default_factory=list)  # prompt + output
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # prefix-cache hashes of the first full blocks
    num_computed_tokens: int = 0  # tokens whose K/V is in the cache
    num_cached_tokens: int = -1  # prompt tokens served from the prefix cache at first admission (-1: not yet)
    text: str = ""
    streamed: int = 0  # characters of `text` already released as deltas
    finish: FinishReason | None = None
    start_s: float = 0.0  # arrival (add_request)
    first_token_s: float = 0.0
    end_s: float = 0.0
    # sampling extras (all off for a plain request)
    logprobs: list[dict[int, Any]] | None = None  # per output token: token id -> output.Logprob
    prompt_logprobs: list[dict[int, Any] | None] | None = None  # set when the prefill's last chunk is done
    partial_prompt_logprobs: list[dict[int, Any]] = field(default_factory=list)  # the chunks' so far
    cumulative_logprob: float = 0.0  # of the sampled tokens (tracked when tracks_logprob)
    tracks_logprob: bool = False  # logprobs asked, or best_of ranks candidates by cumulative logprob
    bad_words_ids: list[list[int]] = field(default_factory=list)  # token sequences of SamplingParams.bad_words
    matcher: Any = None  # structured outputs: the request's grammar matcher (keel.structured)
    error: str | None = None  # why the request failed alone (finish ERROR)
    error_param: str | None = None  # set when that failure is the request's own: the field at fault
    prompt_key: int = 0  # hash of the prompt's tokens: finds a twin whose prefill it can wait for
    leader: Sequence | None = None  # the running twin whose prefill this waiting sequence waits for

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)
        self.prompt_key = hash(tuple(self.prompt_token_ids))
        p = self.params
        self.tracks_logprob = self.tracks_logprob or p.logprobs is not None
        if p.logprobs is not None:
            self.logprobs = []

    @property
    def wants_prompt_logprobs(self) -> bool:
        """The next forward pass must keep all-position logits for this sequence's prompt."""
        return self.params.prompt_logprobs is not None and self.prompt_logprobs is None

    @property
    def num_prompt(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt :]

    @property
    def num_new_tokens(self) -> int:
        """Tokens the next forward pass computes for this sequence."""
        return len(self.token_ids) - self.num_computed_tokens
