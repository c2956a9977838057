"""`load_model`: a checkpoint folder -> a keel model with its weights in place, ready for the runner."""

from __future__ import annotations

from pathlib import Path

import torch

from keel.hf.config import ModelConfig
from keel.hf.memory import DEFAULT_KV_CACHE_BYTES, check_model_memory
from keel.hf.weights import iter_weights, validate_checkpoint
from keel.models import get_model_class
from keel.models.llama import LlamaForCausalLM


def load_model(
    folder: Path,
    config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    progress: bool = True,
    kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES,
) -> LlamaForCausalLM:
    """Build the model without initialising it (meta device), then fill it from the checkpoint.

    First the memory the config implies (src/keel/hf/memory.py) must fit the limit (`KEEL_MAX_MODEL_BYTES` or
    the device's available memory): a ConfigError naming the fields otherwise, before anything is allocated."""
    check_model_memory(config, dtype, device, kv_cache_bytes)
    validate_checkpoint(folder, config)  # headers only: every tensor present, with its shape, before allocating
    cls = get_model_class(config.architecture)
    with torch.device("meta"):
        model = cls(config)
    model = model.to(dtype=dtype).to_empty(device=device)
    if config.tie_word_embeddings:  # to_empty() breaks the tie; restore it
        model.lm_head.weight = model.model.embed_tokens.weight
    model.load_weights(iter_weights(folder, progress=progress))
    return model.eval().requires_grad_(False)
