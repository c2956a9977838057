"""What a `config.json` implies in memory, estimated before anything is allocated, and the limit it must fit.

config.json bounds each field on its own (src/keel/hf/config.py); their products can still ask for more memory
than the machine has: `max_position_embeddings` 2^21 with `head_dim` 2048 is a 32 GiB rotary table build,
`vocab_size` 2^24 an embedding of GiBs. `check_model_memory` adds up the parts keel allocates when it loads
a model (embeddings, lm_head, every layer's weights, the rotary table and its build temporaries, and the KV
cache one full-length sequence fills, up to the engine's default KV budget) and refuses, naming the fields
behind the largest parts, when the sum passes the limit:

- `KEEL_MAX_MODEL_BYTES` when set: bytes, with an optional binary suffix (`512M`, `24G`, `1T`), or `off`;
- otherwise the memory the device can give: `MemAvailable` of /proc/meminfo for the CPU, the free memory
  of a CUDA device; no check when neither is known (not Linux).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import FILE, ConfigError, ModelConfig

ENV = "KEEL_MAX_MODEL_BYTES"
DEFAULT_KV_CACHE_BYTES = 4 << 30  # the engine's default KV budget (EngineConfig.max_kv_cache_bytes reads it)
MEMINFO = Path("/proc/meminfo")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Part:
    """One allocation a config implies: what it is, its bytes and the config fields behind it."""

    what: str
    bytes: int
    fields: str


def gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def estimate_parts(cfg: ModelConfig, dtype: torch.dtype, kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES) -> list[Part]:
    """The allocations loading `cfg` in `dtype` implies, largest first."""
    elem = torch.empty(0, dtype=dtype).element_size()
    h, v, i, d, n = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size, cfg.head_dim, cfg.num_hidden_layers
    q, kv, pos = cfg.q_size, cfg.kv_size, cfg.max_position_embeddings
    layer = h * (q + 2 * kv) + q * h + 3 * i * h + 2 * h
    layer += (q + 2 * kv) * cfg.attention_bias + (2 * i + h) * cfg.mlp_bias + 2 * d * cfg.qk_norm
    hv = f"vocab_size={v}, hidden_size={h}"
    parts = [
        Part("embeddings", v * h * elem, hv),
        Part(
            "layers' weights",
            n * layer * elem,
            f"num_hidden_layers={n}, hidden_size={h}, intermediate_size={i}, "
            f"num_attention_heads={cfg.num_attention_heads}, num_key_value_heads={cfg.num_key_value_heads}, "
            f"head_dim={d}",
        ),
        # rope_cos_sin_cache: float32 angles [P, D/2], cos and sin of them, their [P, D] concatenation,
        # then the table in the model's dtype (the same tensor for float32)
        Part(
            "rotary table (with its build temporaries)",
            pos * d * (10 + (elem if elem != 4 else 0)),
            f"max_position_embeddings={pos}, head_dim={d}",
        ),
        Part(
            "KV cache (one full-length sequence, up to the engine's default budget)",
            min(kv_cache_bytes, 2 * n * kv * pos * elem),
            f"num_hidden_layers={n}, num_key_value_heads={cfg.num_key_value_heads}, head_dim={d}, "
            f"max_position_embeddings={pos}",
        ),
    ]
    if not cfg.tie_word_embeddings:
        parts.append(Part("lm_head", v * h * elem, f"{hv}, tie_word_embeddings=false"))
    return sorted(parts, key=lambda p: -p.bytes)


def parse_size(text: str) -> int | None:
    """`KEEL_MAX_MODEL_BYTES`'s value in bytes; None for `off`; ConfigError naming the variable otherwise."""
    if text.strip().lower() in ("off", "none", "unlimited"):
        return None
    m = _SIZE.match(text)
    if not m:
        raise ConfigError(
            f"{ENV}={text!r}: expected a byte count with an optional binary suffix (e.g. 512M, 24G, 1T) or 'off'"
        )
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def mem_available(meminfo: Path = MEMINFO) -> int | None:
    """`MemAvailable` of /proc/meminfo in bytes, or None where there is none."""
    try:
        text = meminfo.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    m = re.search(r"^MemAvailable:\s+(\d+)\s*kB", text, re.MULTILINE)
    return int(m.group(1)) * 1024 if m else None


def memory_limit(device: torch.device, meminfo: Path = MEMINFO) -> tuple[int | None, str]:
    """The bytes a model may use on `device` and where that figure comes from."""
    override = os.environ.get(ENV)
    if override is not None and override.strip():
        return parse_size(override), ENV
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free), f"the free memory of {device}"
    return mem_available(meminfo), "MemAvailable in /proc/meminfo"


def check_model_memory(
    cfg: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES,
    meminfo: Path = MEMINFO,
) -> list[Part]:
    """Refuse a config whose estimate passes the limit (ConfigError naming the fields of the largest
    parts, the estimate and the limit); returns the parts otherwise."""
    parts = estimate_parts(cfg, dtype, kv_cache_bytes)
    limit, source = memory_limit(device, meminfo)
    total = sum(p.bytes for p in parts)
    if limit is not None and total > limit:
        shown = "; ".join(f"{p.what} {gib(p.bytes)} ({p.fields})" for p in parts[:3] if p.bytes)
        raise ConfigError(
            f"{FILE}: loading this model in {str(dtype).removeprefix('torch.')} needs about {gib(total)}, more than "
            f"the {gib(limit)} {source} allows; the largest parts: {shown}. Expected a config whose sizes fit "
            f"(set {ENV}, e.g. {ENV}=64G, to change the limit)"
        )
    return parts
