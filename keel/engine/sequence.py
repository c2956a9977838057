"""`Sequence`: one request's tokens, cache blocks, stop state and timing."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from keel.engine.sampling_params import SamplingParams
from keel.hf.tokenizer import IncrementalDetokenizer


class FinishReason(enum.Enum):
    EOS = "eos"
    STOP = "stop"  # a stop string
    LENGTH = "length"  # max_tokens or the model's context


@dataclass(slots=True)
class Sequence:
    """Mutable per-request state owned by the engine loop."""

    index: int  # position in the caller's prompt list
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    max_len: int  # prompt + max_tokens, capped to the model context
    detok: IncrementalDetokenizer | None = None
    generator: torch.Generator | None = None
    token_ids: list[int] = field(default_factory=list)  # prompt + output
    block_table: list[int] = field(default_factory=list)
    text: str = ""
    streamed: int = 0  # characters of `text` already handed to the stream callback
    finish: FinishReason | None = None
    start_s: float = 0.0
    first_token_s: float = 0.0
    end_s: float = 0.0

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt :]
