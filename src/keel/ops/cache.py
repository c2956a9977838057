"""KV-cache ops: reshape_and_cache (paged cache writes)."""

from __future__ import annotations

import torch

from keel.ops import _checks as chk

_reshape_and_cache = torch.ops.keel.reshape_and_cache.default
_OP = "keel::reshape_and_cache"


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write key/value [T, kv_heads, head_size] into caches [blocks, block_size, kv_heads, head_size].

    Token t goes to block slot_mapping[t] // block_size, offset slot_mapping[t] % block_size; -1 skips it.
    On CPU a slot used twice, or caches that share memory, are refused with an error; on CUDA slot
    ranges are checked on the device, duplicates are not (which token lands is then undefined).
    """
    _reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)


# Mutates the caches and returns nothing; the fake validates shapes and dtypes (slot values are
# checked by the kernels).
@torch.library.register_fake("keel::reshape_and_cache")
def _(key, value, key_cache, value_cache, slot_mapping) -> None:
    for arg, t in (
        ("value", value),
        ("key_cache", key_cache),
        ("value_cache", value_cache),
        ("slot_mapping", slot_mapping),
    ):
        chk.same_device(_OP, arg, t, "key", key)
    chk.float_dtype(_OP, "key", key)
    for arg, t in (("value", value), ("key_cache", key_cache), ("value_cache", value_cache)):
        chk.same_dtype(_OP, arg, t, "key", key)
    chk.dim(_OP, "key", key, 3)
    chk.same_shape(_OP, "value", value, "key", key)
    chk.dim(_OP, "key_cache", key_cache, 4)
    chk.same_shape(_OP, "value_cache", value_cache, "key_cache", key_cache)
    chk.check(
        key_cache.shape[2] == key.shape[1] and key_cache.shape[3] == key.shape[2],
        f"{_OP}: key_cache must be [num_blocks, block_size, {key.shape[1]}, {key.shape[2]}] to hold key "
        f"{chk.shape(key)}, got {chk.shape(key_cache)}",
    )
    chk.check(key_cache.shape[1] > 0, f"{_OP}: key_cache block_size must be positive, got shape {chk.shape(key_cache)}")
    chk.check(
        slot_mapping.dtype == torch.int64,
        f"{_OP}: slot_mapping must be int64, got {chk.dtype_name(slot_mapping.dtype)}",
    )
    chk.check(
        slot_mapping.dim() == 1 and slot_mapping.shape[0] == key.shape[0],
        f"{_OP}: slot_mapping must be 1-D with one slot per token ({key.shape[0]}), got shape "
        f"{chk.shape(slot_mapping)}",
    )
    chk.not_same(_OP, "key_cache", key_cache, "value_cache", value_cache)
