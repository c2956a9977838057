"""`ModelConfig`: the subset of a Hugging Face `config.json` that keel's models need."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ConfigError(ValueError):
    """A `config.json` that keel cannot use: missing, malformed or unsupported."""


@dataclass(slots=True, frozen=True)
class RopeConfig:
    """Rotary embedding parameters (`rope_parameters` or the older `rope_theta`/`rope_scaling`)."""

    theta: float = 10000.0
    rope_type: str = "default"  # "default" or "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in ("default", "llama3"):
            raise ConfigError(f"rope type {self.rope_type!r} is not supported; expected 'default' or 'llama3'")
        if self.theta <= 0:
            raise ConfigError(f"rope_theta must be > 0, got {self.theta}")


@dataclass(slots=True, frozen=True)
class ModelConfig:
    """Validated architecture hyper-parameters of a Llama-family checkpoint."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = field(default_factory=RopeConfig)
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: always True
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: per-head RMSNorm on q and k
    sliding_window: int | None = None  # Mistral
    hidden_act: str = "silu"
    torch_dtype: torch.dtype | None = None
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"config.json: {name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"config.json: num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ConfigError(f"config.json: head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.hidden_act != "silu":
            raise ConfigError(f"config.json: hidden_act {self.hidden_act!r} is not supported; expected 'silu'")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ConfigError(f"config.json: sliding_window must be positive or null, got {self.sliding_window}")

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Build from a parsed `config.json`, accepting both old and new key spellings."""
        archs = raw.get("architectures") or []
        if not archs:
            raise ConfigError("config.json: 'architectures' is missing; expected e.g. ['LlamaForCausalLM']")
        arch = archs[0]
        missing = [
            k
            for k in (
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
            )
            if k not in raw
        ]
        if missing:
            raise ConfigError(f"config.json: required keys missing: {', '.join(missing)}")
        heads = raw["num_attention_heads"]
        kv_heads = raw.get("num_key_value_heads") or heads
        head_dim = raw.get("head_dim") or raw["hidden_size"] // heads
        dtype_name = raw.get("dtype") or raw.get("torch_dtype")
        dtype = _DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        window = raw.get("sliding_window")
        if arch != "MistralForCausalLM" and not raw.get("use_sliding_window", False):
            window = None  # Qwen2/Qwen3 carry a sliding_window value but only use it when enabled
        return cls(
            architecture=arch,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope=_rope_from_dict(raw),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=arch == "Qwen2ForCausalLM" or bool(raw.get("attention_bias", False)),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            sliding_window=window,
            hidden_act=raw.get("hidden_act", "silu"),
            torch_dtype=dtype,
            eos_token_ids=eos_ids,
            bos_token_id=raw.get("bos_token_id"),
        )

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        """Read and validate `config.json`."""
        return cls.from_dict(read_config_json(path))


def read_config_json(path: str | Path) -> dict[str, Any]:
    """The parsed `config.json`, or a `ConfigError` saying why it cannot be read."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"config.json not found at {path}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a JSON object, got {type(raw).__name__}")
    return raw


def _rope_from_dict(raw: dict[str, Any]) -> RopeConfig:
    """Merge `rope_parameters` (new) with `rope_theta` + `rope_scaling` (old)."""
    params: dict[str, Any] = {}
    if isinstance(raw.get("rope_scaling"), dict):
        params.update(raw["rope_scaling"])
    if isinstance(raw.get("rope_parameters"), dict):
        params.update(raw["rope_parameters"])
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type == "default":
        return RopeConfig(theta=float(theta))
    if rope_type != "llama3":
        raise ConfigError(f"config.json: rope type {rope_type!r} is not supported; expected 'default' or 'llama3'")
    try:
        return RopeConfig(
            theta=float(theta),
            rope_type="llama3",
            factor=float(params["factor"]),
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(params["original_max_position_embeddings"]),
        )
    except KeyError as exc:
        raise ConfigError(f"config.json: llama3 rope scaling needs {exc.args[0]!r}") from exc
