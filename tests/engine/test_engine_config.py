"""`EngineConfig` is the one source of the engine's defaults (LLM, LLMEngine and `keel serve` read it) and
validates itself: every bad value is a ConfigError naming the field, raised before anything is loaded."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from keel.cli import build_parser
from keel.engine import LLM, ConfigError, EngineConfig, LLMEngine
from keel.engine.config import DEFAULTS


def test_llm_and_engine_defaults_are_the_configs_fields():
    fields = [(f.name, getattr(DEFAULTS, f.name)) for f in dataclasses.fields(EngineConfig)]
    for cls in (LLM, LLMEngine):
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
        assert [(p.name, p.default) for p in params] == fields, cls.__name__


def test_keel_serve_defaults_are_the_configs():
    args = build_parser().parse_args(["serve"])
    assert (args.block_size, args.max_num_seqs, args.max_num_batched_tokens, args.prefix_caching) == (
        DEFAULTS.block_size,
        DEFAULTS.max_num_seqs,
        DEFAULTS.max_num_batched_tokens,
        DEFAULTS.enable_prefix_caching,
    )
    assert int(args.kv_cache_gib * (1 << 30)) == DEFAULTS.max_kv_cache_bytes
    assert build_parser().parse_args(["serve", "--no-prefix-caching"]).prefix_caching is False


BAD = [
    ({"block_size": 0}, "block_size", r"EngineConfig: block_size must be an integer >= 1, got 0"),
    ({"max_num_seqs": True}, "max_num_seqs", r"EngineConfig: max_num_seqs must be an integer >= 1, got True"),
    ({"max_kv_cache_bytes": 1.5}, "max_kv_cache_bytes", r"max_kv_cache_bytes must be an integer >= 1"),
    ({"max_num_batched_tokens": 0}, "max_num_batched_tokens", r"max_num_batched_tokens must be an integer >= 1"),
    (
        {"max_num_seqs": 64, "max_num_batched_tokens": 32},
        "max_num_batched_tokens",
        r"EngineConfig: max_num_batched_tokens must be >= max_num_seqs \(64\)",
    ),
    ({"model": ""}, "model", r"EngineConfig: model must be a non-empty string"),
    ({"dtype": "int8"}, "dtype", r"dtype 'int8' is not supported; expected one of auto, float32"),
    ({"device": 3}, "device", r"EngineConfig: device must be a non-empty string or None"),
    ({"enable_prefix_caching": "no"}, "enable_prefix_caching", r"enable_prefix_caching must be True or False"),
    ({"quantization": "int4"}, "quantization", r"quantization 'int4' is not supported"),
]


@pytest.mark.parametrize("kwargs, field, message", BAD)
def test_bad_values_name_the_field(kwargs, field, message):
    with pytest.raises(ConfigError, match=message) as info:
        EngineConfig(**kwargs)
    assert info.value.field == field and isinstance(info.value, ValueError)


def test_engine_validates_before_loading(monkeypatch):
    def never(*_a, **_k):
        raise AssertionError("resolved the model before validating its config")

    monkeypatch.setattr("keel.engine.llm_engine.resolve_model", never)
    with pytest.raises(ConfigError, match="block_size") as info:
        LLM("no/such-model", block_size=0)
    assert info.value.field == "block_size"
