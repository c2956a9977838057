"""keel's inference engine: `LLMEngine` (add_request / step / abort_request / metrics), the offline `LLM`
over it, `EngineConfig` (what both are built with, and their defaults), `SamplingParams` and
`RequestOutput`; the typed errors `RequestValidationError` and `ConfigError` carry the field they are about.

Inside, top down: `llm_engine` (each step = schedule -> run -> postprocess), `scheduler` (owns the KV-cache
bookkeeping of `block_manager`), `model_runner` (owns the K/V tensors, prepares inputs, runs the model from
`keel.models` / `keel.layers`, samples), `model_loader`, `sequence`, `output`, `dtypes`; `async_engine`
drives an engine from one thread for asyncio callers (`keel serve`)."""

from __future__ import annotations

from keel.engine.config import EngineConfig
from keel.engine.errors import ConfigError, RequestValidationError
from keel.engine.llm import LLM
from keel.engine.llm_engine import LLMEngine
from keel.engine.output import CompletionOutput, EngineMetrics, GenerateStats, Logprob, RequestOutput
from keel.engine.sampling_params import SamplingParams, StructuredOutputsParams

__all__ = [
    "LLM",
    "CompletionOutput",
    "ConfigError",
    "EngineConfig",
    "EngineMetrics",
    "GenerateStats",
    "LLMEngine",
    "Logprob",
    "RequestOutput",
    "RequestValidationError",
    "SamplingParams",
    "StructuredOutputsParams",
]
