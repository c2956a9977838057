"""keel's inference engine: `LLMEngine` (add_request / step / abort_request), the offline `LLM`, and
`SamplingParams`."""

from __future__ import annotations

from keel.engine.core import EngineMetrics, GenerateStats, LLMEngine, RequestOutput
from keel.engine.llm import LLM
from keel.engine.sampling_params import SamplingParams

__all__ = ["LLM", "EngineMetrics", "GenerateStats", "LLMEngine", "RequestOutput", "SamplingParams"]
