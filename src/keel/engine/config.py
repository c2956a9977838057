"""`EngineConfig`: the one place an engine setting, its default and its help text are written.

`LLM(model, **settings)` and `LLMEngine(model, **settings)` take its fields as keywords, and `keel serve`,
`keel generate` and `keel chat` generate their engine flags from them (`keel.cli.flags`): a new setting is
one field here. Each field carries its help (and, where the flag differs from the field, the flag's name,
choices or unit) in its metadata; `setting` writes that. The config validates itself on construction, so a
bad value is a `ConfigError` naming the field before anything is resolved or loaded."""

from __future__ import annotations

from dataclasses import Field, asdict, dataclass, field, fields
from typing import Any, NoReturn

import torch

from keel.engine.dtypes import DTYPES
from keel.engine.errors import ConfigError
from keel.hf.memory import DEFAULT_KV_CACHE_BYTES
from keel.hf.resolve import DEFAULT_MODEL
from keel.layers.fp8_linear import QUANTIZATIONS, check_quantization

GIB = 1 << 30


def setting(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    choices: tuple[str, ...] | None = None,
    unit: tuple[str, int] | None = None,
    env: str | None = None,
) -> Any:
    """A dataclass field with its command-line face: `help`, and where the default spelling does not fit,
    `flag` (the option's name), `choices`, `unit` (name and size: the flag takes a float of that unit, the
    field holds an int) or `env` (an environment variable that overrides the flag's default)."""
    meta = {"help": help, "flag": flag, "choices": choices, "unit": unit, "env": env}
    return field(default=default, metadata={k: v for k, v in meta.items() if v is not None})


def flag_name(f: Field[Any]) -> str:
    """The command-line option of a `setting` field: its `flag`, else the name in dashes without a unit
    suffix (`send_timeout_s` -> `--send-timeout`), a True-by-default flag as its `--no-` form."""
    if "flag" in f.metadata:
        return str(f.metadata["flag"])
    name = f.name.removesuffix("_s").replace("_", "-")
    return f"--no-{name}" if f.default is True else f"--{name}"


@dataclass(slots=True)
class EngineConfig:
    """An engine's construction arguments (vLLM's names where vLLM has one). Invalid values raise
    `ConfigError` (a ValueError) naming the field."""

    model: str = setting(DEFAULT_MODEL, "Hugging Face repo id, keel/<name> (keel's own conversions) or local folder")
    dtype: str | torch.dtype | None = setting(
        "auto", "weights and activations; auto: bf16 where supported, else fp32", choices=("auto", *DTYPES)
    )
    device: str | None = setting(None, "cpu or cuda (default: cuda if available)")
    revision: str | None = setting(None, "hub revision (branch, tag or commit)")
    block_size: int = setting(16, "tokens per KV-cache block (a multiple of 16 takes the paged kernels)")
    max_num_seqs: int = setting(64, "sequences decoded together in one step at most")
    max_kv_cache_bytes: int = setting(
        DEFAULT_KV_CACHE_BYTES,
        "the KV cache's budget; the pool grows to it on demand",
        flag="--kv-cache-gib",
        unit=("GiB", GIB),
    )
    # why 256 on a CPU: docs/measurements/2026-12-02-chunked-prefill.md
    max_num_batched_tokens: int = setting(
        256,
        "tokens one step computes at most: decodes first, then prompts, a longer one in chunks over several "
        "steps (at least --max-num-seqs; raise it on a GPU)",
    )
    enable_prefix_caching: bool = setting(
        True, "share the KV blocks of common prompt prefixes", flag="--no-prefix-caching"
    )
    progress: bool = setting(True, "a progress bar while loading weights")
    cpu_prepack: bool = setting(False, "oneDNN-prepacked weights for prompt projections (CPU)")
    quantization: str | None = setting(
        None, "fp8: block-scaled FP8 weights for the linear layers (default: none)", choices=QUANTIZATIONS
    )

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

    @classmethod
    def of(cls, caller: str, model: str | None = None, **settings: Any) -> EngineConfig:
        """The config of `caller(model, **settings)` (`LLM`, `LLMEngine`): an unknown keyword is a
        ConfigError naming it; `model=None` takes the default model."""
        names = [f.name for f in fields(cls)]
        for name in settings:
            if name not in names or name == "model":
                _fail(name, f"{caller}: unknown setting {name!r}; expected one of {', '.join(names[1:])}")
        return cls(**settings) if model is None else cls(model, **settings)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fail(name: str, message: str) -> NoReturn:
    raise ConfigError(name, message)


DEFAULTS = EngineConfig()  # what LLM / LLMEngine / keel serve use when not told otherwise
