"""`EngineConfig`: what an engine is built with, validated in one place, and the one source of the defaults
of `LLM`, `LLMEngine` and `keel serve` (their keyword arguments and flags read `DEFAULTS`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, NoReturn

import torch

from keel.engine.dtypes import DTYPES
from keel.engine.errors import ConfigError
from keel.hf.memory import DEFAULT_KV_CACHE_BYTES
from keel.hf.resolve import DEFAULT_MODEL
from keel.layers.fp8_linear import check_quantization


@dataclass(slots=True)
class EngineConfig:
    """An engine's construction arguments (vLLM's names where vLLM has one). Invalid values raise
    `ConfigError` (a ValueError) naming the field."""

    model: str = DEFAULT_MODEL  # a Hugging Face repo id or a local folder
    dtype: str | torch.dtype | None = None  # None: bf16 where supported, else fp32
    device: str | None = None  # None: cuda if available, else cpu
    revision: str | None = None  # hub revision (branch, tag or commit)
    block_size: int = 16  # tokens per KV-cache block (a multiple of 16 takes the paged kernels)
    max_num_seqs: int = 64  # sequences in one step at most
    max_kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES  # the KV pool's budget; the pool grows to it on demand
    # tokens one step computes at most (decodes first, then prompts, longer ones in chunks over several
    # steps): what a long prompt adds to each step of the running decodes. On 2 CPU cores a prompt token
    # costs the same from 64- to 512-token chunks and more in larger ones (docs/measurements/2026-12-02-
    # chunked-prefill.md), so 256 halves 512's stall at no prefill cost; raise it on a GPU.
    max_num_batched_tokens: int = 256
    enable_prefix_caching: bool = True  # share the KV blocks of common prompt prefixes
    progress: bool = True  # a progress bar while loading weights
    cpu_prepack: bool = False  # oneDNN-prepacked weights for prompt projections (CPU)
    quantization: str | None = None  # None / "none", or "fp8" (block-scaled FP8 linear weights)

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            _fail("model", f"EngineConfig: model must be a non-empty string (repo id or folder), got {self.model!r}")
        if isinstance(self.dtype, str) and self.dtype != "auto" and self.dtype not in DTYPES:
            _fail("dtype", f"dtype {self.dtype!r} is not supported; expected one of auto, {', '.join(DTYPES)}")
        if self.dtype is not None and not isinstance(self.dtype, str | torch.dtype):
            _fail("dtype", f"EngineConfig: dtype must be a name, a torch.dtype or None, got {self.dtype!r}")
        for name in ("device", "revision"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                _fail(name, f"EngineConfig: {name} must be a non-empty string or None, got {value!r}")
        for name in ("block_size", "max_num_seqs", "max_kv_cache_bytes", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                _fail(name, f"EngineConfig: {name} must be an integer >= 1, got {value!r}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            _fail(
                "max_num_batched_tokens",
                f"EngineConfig: max_num_batched_tokens must be >= max_num_seqs ({self.max_num_seqs}): every "
                f"running sequence's decode token fits in one step, got {self.max_num_batched_tokens}",
            )
        for name in ("enable_prefix_caching", "progress", "cpu_prepack"):
            if not isinstance(getattr(self, name), bool):
                _fail(name, f"EngineConfig: {name} must be True or False, got {getattr(self, name)!r}")
        try:
            check_quantization(self.quantization)
        except ValueError as exc:
            raise ConfigError("quantization", str(exc)) from None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fail(name: str, message: str) -> NoReturn:
    raise ConfigError(name, message)


DEFAULTS = EngineConfig()  # what LLM / LLMEngine / keel serve use when not told otherwise
