"""The names users import stay where they are, and `LLM` is a thin face over `LLMEngine`: the same
constructor arguments (it builds one and keeps it as `llm_engine`), no test hooks in `generate`."""

from __future__ import annotations

import inspect

import keel
import keel.engine


def test_top_level_names_are_the_engines():
    for name in ("LLM", "LLMEngine", "SamplingParams", "StructuredOutputsParams", "RequestOutput"):
        assert getattr(keel, name) is getattr(keel.engine, name), name
    assert {"EngineMetrics", "GenerateStats"} <= set(keel.engine.__all__)


def test_llm_takes_exactly_the_engine_arguments():
    llm = inspect.signature(keel.LLM.__init__).parameters
    engine = inspect.signature(keel.LLMEngine.__init__).parameters
    assert [(p.name, p.kind, p.default, p.annotation) for p in llm.values()] == [
        (p.name, p.kind, p.default, p.annotation) for p in engine.values()
    ]


def test_generate_and_chat_signatures():
    for method in (keel.LLM.generate, keel.LLM.chat):
        params = inspect.signature(method).parameters
        assert list(params)[1:] == [list(params)[1], "sampling_params", "stream"]
        assert params["stream"].kind is inspect.Parameter.KEYWORD_ONLY
