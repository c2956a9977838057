"""`EngineConfig` is the one definition of every engine setting (LLM's and LLMEngine's keywords and the
CLI's flags come from its fields; `ServerConfig` likewise for `keel serve`'s own options) and validates
itself: every bad value is a ConfigError naming the field, raised before anything is loaded."""

from __future__ import annotations

import dataclasses

import pytest

from keel.cli import build_parser
from keel.cli.flags import from_flags
from keel.engine import LLM, ConfigError, EngineConfig, LLMEngine
from keel.engine.config import DEFAULTS, setting
from keel.entrypoints.openai.server_config import ServerConfig


def _parse(*argv: str):
    return build_parser().parse_args(list(argv))


@pytest.mark.parametrize("verb", ["serve", "generate", "chat"])
def test_every_setting_is_a_flag_with_the_configs_default(verb):
    extra = ["--prompt", "x"] if verb == "generate" else []
    args = vars(_parse(verb, *extra))
    assert {f.name: args[f.name] for f in dataclasses.fields(EngineConfig)} == DEFAULTS.to_dict()


def test_every_server_option_is_a_serve_flag_with_its_default(monkeypatch):
    monkeypatch.delenv("KEEL_API_KEY", raising=False)
    args = vars(_parse("serve"))
    assert {f.name: args[f.name] for f in dataclasses.fields(ServerConfig)} == dataclasses.asdict(ServerConfig())
    assert from_flags(ServerConfig, _parse("serve")) == ServerConfig()
    monkeypatch.setenv("KEEL_API_KEY", "k")
    assert _parse("serve").api_key == "k"


# the flag names users, tests and docs already type; generated from the fields, they must keep working
KEPT = [
    (["--kv-cache-gib", "0.5"], "max_kv_cache_bytes", 1 << 29),
    (["--no-prefix-caching"], "enable_prefix_caching", False),
    (["--max-tokens-limit", "9"], "max_tokens", 9),
    (["--keep-alive-timeout", "2"], "keep_alive_s", 2.0),
    (["--chat-template-timeout", "3"], "template_timeout_s", 3.0),
    (["--send-timeout", "4"], "send_timeout_s", 4.0),
    (["--shutdown-timeout", "0"], "shutdown_timeout_s", 0.0),
    (["--trust-request-chat-template"], "trust_request_chat_template", True),
    (["--max-num-batched-tokens", "512"], "max_num_batched_tokens", 512),
    (["--dtype", "bf16"], "dtype", "bf16"),
    (["--quantization", "fp8"], "quantization", "fp8"),
]


@pytest.mark.parametrize("argv, field, value", KEPT)
def test_existing_flag_names_set_their_field(argv, field, value):
    assert getattr(_parse("serve", *argv), field) == value


def test_a_new_setting_is_one_field(monkeypatch, capsys):
    """Adding a field to EngineConfig is the whole change: `keel serve` gets its flag (name, type, default,
    help), `LLM` its keyword, and both reach the engine's config."""

    @dataclasses.dataclass(slots=True)
    class Extended(EngineConfig):
        spec_tokens: int = setting(3, "draft tokens per step")

    monkeypatch.setattr("keel.cli.serve.EngineConfig", Extended)
    with pytest.raises(SystemExit):
        _parse("serve", "--help")
    assert "--spec-tokens SPEC_TOKENS" in capsys.readouterr().out
    assert _parse("serve").spec_tokens == 3
    assert from_flags(Extended, _parse("serve", "--spec-tokens", "5")).spec_tokens == 5

    built = []
    monkeypatch.setattr("keel.engine.llm.EngineConfig", Extended)
    monkeypatch.setattr(LLMEngine, "from_config", classmethod(lambda cls, config: built.append(config)))
    LLM("some/model", spec_tokens=4)
    LLM()
    assert [(c.model, c.spec_tokens) for c in built] == [("some/model", 4), (DEFAULTS.model, 3)]


def test_an_unknown_keyword_names_itself():
    with pytest.raises(ConfigError, match=r"LLM: unknown setting 'blok_size'; expected one of dtype, ") as info:
        LLM("no/such-model", blok_size=8)
    assert info.value.field == "blok_size"


def test_server_config_errors_name_the_flag():
    with pytest.raises(ValueError, match=r"--max-tokens-limit must be >= 1 \(ServerConfig.max_tokens\), got 0"):
        ServerConfig(max_tokens=0)


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
