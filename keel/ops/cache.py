"""KV-cache ops: reshape_and_cache (paged cache writes)."""

from __future__ import annotations

import torch

_reshape_and_cache = torch.ops.keel.reshape_and_cache.default


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write key/value [T, kv_heads, head_size] into caches [blocks, block_size, kv_heads, head_size].

    Token t goes to block slot_mapping[t] // block_size, offset slot_mapping[t] % block_size; -1 skips it.
    """
    _reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)


# Mutates the caches and returns nothing; the fake only validates shapes.
@torch.library.register_fake("keel::reshape_and_cache")
def _(key, value, key_cache, value_cache, slot_mapping) -> None:
    torch._check(key.dim() == 3 and key_cache.dim() == 4, lambda: "keel::reshape_and_cache: key must be 3-D "
                 f"and key_cache 4-D, got {list(key.shape)} and {list(key_cache.shape)}")
    torch._check(slot_mapping.shape == (key.shape[0],), lambda: "keel::reshape_and_cache: slot_mapping must be "
                 f"1-D with one slot per token ({key.shape[0]}), got shape {list(slot_mapping.shape)}")
