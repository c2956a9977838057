"""keel's inference engine: `LLM` and `SamplingParams`."""

from __future__ import annotations

from keel.engine.llm import LLM, GenerateStats, RequestOutput
from keel.engine.sampling_params import SamplingParams

__all__ = ["LLM", "GenerateStats", "RequestOutput", "SamplingParams"]
