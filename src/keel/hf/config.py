"""`ModelConfig`: the subset of a Hugging Face `config.json` that keel's models need, typed and range-checked.

Every field keel reads is checked for its JSON type (an int is not a bool, a float is finite), its range
and its relation to the others (heads divide the hidden size, kv heads divide heads, ids inside the
vocabulary), and bounded so that an absurd value is refused here, by name, before anything is
allocated. The bounds are far above any released Llama-family model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .errors import CheckpointError, read_json_object_text
from .fields import FieldReader

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FILE = "config.json"

# size bounds: a value past one is a corrupt config, refused before anything is allocated
MAX_VOCAB = 1 << 24
MAX_HIDDEN = 1 << 17
MAX_INTERMEDIATE = 1 << 20
MAX_LAYERS = 1 << 12
MAX_HEADS = 1 << 12
MAX_HEAD_DIM = 1 << 11
# keel builds a [max_position_embeddings, head_dim] rotary table at load: 2M positions x 128 x 4 bytes = 1 GiB
# (each bound holds alone; src/keel/hf/memory.py checks what their products add up to before loading)
MAX_POSITIONS = 1 << 21
MAX_THETA = 1e12
# the architectures whose config.json this module parses (the Llama family); src/keel/models registers a class
# for each (tests/engine/test_hf_loading.py checks the two lists agree)
ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


class ConfigError(CheckpointError):
    """A `config.json` that keel cannot use: missing, malformed, out of range or unsupported."""


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
            raise ConfigError(f"{FILE}: rope type {self.rope_type!r} is not supported; expected 'default' or 'llama3'")
        if not 0 < self.theta <= MAX_THETA:
            raise ConfigError(f"{FILE}: rope_theta must be a finite number in (0, {MAX_THETA:g}], got {self.theta}")
        if self.rope_type == "llama3" and not self.high_freq_factor > self.low_freq_factor > 0:
            raise ConfigError(
                f"{FILE}: llama3 rope scaling needs high_freq_factor > low_freq_factor > 0, got "
                f"high_freq_factor={self.high_freq_factor}, low_freq_factor={self.low_freq_factor}"
            )


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
        for name, hi in (
            ("vocab_size", MAX_VOCAB),
            ("hidden_size", MAX_HIDDEN),
            ("intermediate_size", MAX_INTERMEDIATE),
            ("num_hidden_layers", MAX_LAYERS),
            ("num_attention_heads", MAX_HEADS),
            ("num_key_value_heads", MAX_HEADS),
            ("head_dim", MAX_HEAD_DIM),
            ("max_position_embeddings", MAX_POSITIONS),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
                raise ConfigError(f"{FILE}: {name} must be an integer in [1, {hi}], got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"{FILE}: num_key_value_heads must divide num_attention_heads ({self.num_attention_heads}), "
                f"got {self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ConfigError(f"{FILE}: head_dim must be even for rotary embeddings, got {self.head_dim}")
        if not 0 < self.rms_norm_eps < 1:
            raise ConfigError(f"{FILE}: rms_norm_eps must be a finite number in (0, 1), got {self.rms_norm_eps}")
        if self.hidden_act != "silu":
            raise ConfigError(f"{FILE}: hidden_act {self.hidden_act!r} is not supported; expected 'silu'")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ConfigError(f"{FILE}: sliding_window must be positive or null, got {self.sliding_window}")
        for name, ids in (("eos_token_id", self.eos_token_ids), ("bos_token_id", (self.bos_token_id,))):
            bad = [i for i in ids if i is not None and not 0 <= i < self.vocab_size]
            if bad:
                raise ConfigError(f"{FILE}: {name} {bad[0]} is outside the vocabulary (vocab_size {self.vocab_size})")

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Build from a parsed `config.json`, accepting both old and new key spellings."""
        arch = architecture(raw)
        r = FieldReader(raw, FILE, ConfigError)
        vocab = r.get_int("vocab_size", 1, MAX_VOCAB)
        hidden = r.get_int("hidden_size", 1, MAX_HIDDEN)
        heads = r.get_int("num_attention_heads", 1, MAX_HEADS)
        kv_heads = r.get_int("num_key_value_heads", 1, MAX_HEADS, default=heads)
        head_dim = r.get_int("head_dim", 1, MAX_HEAD_DIM, default=None)
        if head_dim is None:  # transformers: hidden_size // num_attention_heads
            if hidden % heads:
                raise ConfigError(
                    f"{FILE}: num_attention_heads must be a positive int dividing hidden_size ({hidden}), got {heads} "
                    "(or give head_dim)"
                )
            head_dim = hidden // heads
        dtype_name = _dtype_name(raw, r)
        r.get_int("pad_token_id", -(2**31), 2**31 - 1, default=None, expected="an integer or null")  # unused, typed
        window = r.get_int("sliding_window", 1, 2**31 - 1, default=None)
        use_window = r.get_bool("use_sliding_window", False)
        if arch != "MistralForCausalLM" and not use_window:
            window = None  # Qwen2/Qwen3 carry a sliding_window value but only use it when enabled
        elif use_window and window is None:
            raise r.fail("sliding_window", "a positive integer when use_sliding_window is true", None)
        return cls(
            architecture=arch,
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=r.get_int("intermediate_size", 1, MAX_INTERMEDIATE),
            num_hidden_layers=r.get_int("num_hidden_layers", 1, MAX_LAYERS),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            max_position_embeddings=r.get_int("max_position_embeddings", 1, MAX_POSITIONS, default=2048),
            rms_norm_eps=r.get_float("rms_norm_eps", 0, 1, default=1e-6, lo_open=True, hi_open=True),
            rope=_rope_from_dict(raw, r),
            tie_word_embeddings=r.get_bool("tie_word_embeddings", False),
            attention_bias=arch == "Qwen2ForCausalLM" or r.get_bool("attention_bias", False),
            mlp_bias=r.get_bool("mlp_bias", False),
            qk_norm=arch == "Qwen3ForCausalLM",
            sliding_window=window,
            hidden_act=r.get_str("hidden_act", "silu", choices=("silu",)),
            torch_dtype=_DTYPES.get(dtype_name) if dtype_name else None,
            eos_token_ids=r.token_ids("eos_token_id", vocab),
            bos_token_id=(r.token_ids("bos_token_id", vocab, allow_list=False) or (None,))[0],
        )

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        """Read and validate `config.json`."""
        return cls.from_dict(read_config_json(path))


def architecture(raw: dict[str, Any]) -> str:
    """`architectures[0]`, checked: a non-empty list of strings whose first keel supports."""
    archs = raw.get("architectures")
    if not archs:
        raise ConfigError(f"{FILE}: 'architectures' is missing; expected e.g. ['LlamaForCausalLM']")
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise ConfigError(
            f"{FILE}: architectures must be a list of strings such as ['LlamaForCausalLM'], got {archs!r}"
        )
    if archs[0] not in ARCHITECTURES:
        raise ConfigError(
            f"{FILE}: architectures[0] {archs[0]!r} is not supported; supported: {', '.join(ARCHITECTURES)}"
        )
    return archs[0]


def read_config_json(path: str | Path) -> dict[str, Any]:
    """The parsed `config.json` with a well-formed `architectures`, or a `ConfigError` saying why not."""
    path = Path(path)
    raw, _ = read_json_object_text(path, ConfigError, missing=f"config.json not found at {path}")
    architecture(raw)
    return raw


def _dtype_name(raw: dict[str, Any], r: FieldReader) -> str | None:
    """`dtype` (new) or `torch_dtype` (old): the name of a torch dtype, or null."""
    for key in ("dtype", "torch_dtype"):
        name = r.get_str(key, None)
        if name is not None:
            if not isinstance(getattr(torch, name, None), torch.dtype):
                raise r.fail(key, "the name of a torch dtype such as 'bfloat16'", name)
            return name
    return None


def _rope_from_dict(raw: dict[str, Any], r: FieldReader) -> RopeConfig:
    """Merge `rope_parameters` (new) with `rope_theta` + `rope_scaling` (old); errors name the key they read."""
    params: dict[str, Any] = {}
    where: dict[str, str] = {}
    for key in ("rope_scaling", "rope_parameters"):  # the newer spelling wins
        sub = r.get_dict(key)
        if sub:
            params.update(sub)
            where.update(dict.fromkeys(sub, key))
    src = {k: FieldReader(params, FILE, ConfigError, prefix=f"{where[k]}.") for k in params}
    top = FieldReader(raw, FILE, ConfigError)
    theta_reader = src.get("rope_theta", top)
    theta = theta_reader.get_float("rope_theta", 0, MAX_THETA, default=10000.0, lo_open=True)
    scaling = raw.get("rope_scaling")
    if isinstance(scaling, dict) and scaling and "rope_type" not in params and "type" not in params:
        raise ConfigError(f"{FILE}: rope_scaling must name its rope_type (e.g. 'llama3'), got {scaling!r:.60}")
    type_key = "rope_type" if "rope_type" in params else "type"
    rope_type = src[type_key].get_str(type_key, "default") if type_key in params else "default"
    if rope_type == "default":
        return RopeConfig(theta=theta)
    if rope_type != "llama3":
        raise ConfigError(
            f"{FILE}: {where[type_key]}.{type_key}: rope type {rope_type!r} is not supported; "
            "expected 'default' or 'llama3'"
        )
    block = FieldReader(params, FILE, ConfigError, prefix=f"{where[type_key]}.")

    def rd(key: str) -> FieldReader:
        return src.get(key, block)

    return RopeConfig(
        theta=theta,
        rope_type="llama3",
        factor=rd("factor").get_float("factor", 1, 1e6),
        low_freq_factor=rd("low_freq_factor").get_float("low_freq_factor", 0, 1e6, default=1.0, lo_open=True),
        high_freq_factor=rd("high_freq_factor").get_float("high_freq_factor", 0, 1e6, default=4.0, lo_open=True),
        original_max_position_embeddings=rd("original_max_position_embeddings").get_int(
            "original_max_position_embeddings", 1, MAX_POSITIONS
        ),
    )
